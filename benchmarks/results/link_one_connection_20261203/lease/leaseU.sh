#!/usr/bin/env bash
# one lease: Fig. 5d at 512 KiB, one connection, unlimited link: 118d495 (A), A + the trim
# threshold that keeps a channel's capacity mapped (B), B + one lock turn a written message (D,
# the tree), D with max_batch_bytes 2 MiB (D2) and 4 MiB (D4); three rounds alternating.
# Then comm.py 16 and 32 actors with A and D, Fig. 5d's five sizes with D, a py-spy profile of D.
source /tmp/tj/.old_src/jobs.sh  # the tree, $X, job and run
mk() { local t=/tmp/tj$1; rm -rf $t; mkdir -p $t; cp -r benchmarks jobqueue $t/; }
mk A; tar xzf .old_src/A.tgz -C /tmp/tjA
mk B; tar xzf .old_src/B.tgz -C /tmp/tjB
for v in D2:2 D4:4; do
  IFS=: read name batch <<< "$v"; mk $name; cp -r tianji_dask /tmp/tj$name/
  sed -i "s/max_batch_bytes: int = 1 << 20,/max_batch_bytes: int = $batch << 20,/" /tmp/tj$name/tianji_dask/channels/queue_sender.py
done
ln -s /tmp/tj /tmp/tjD
{ nproc; lscpu | grep -i "model name"; cat .old_src/commit.txt; for v in A B D D2 D4; do echo "$v: $(grep -h 'max_batch_bytes: int\|^_KEEP_MAX\|one lock turn\|One turn' /tmp/tj$v/tianji_dask/channels/*.py | tr -s ' ' | tr '\n' ' ')"; done; } > $X/machine.txt 2>&1
L="python3 -u benchmarks/link_throughput.py --rates unlimited --sizes 524288 --messages 10000"
for r in 1 2 3; do for v in A B D D2 D4; do run link_${v}_r$r $v $L; done; done
touch $X/LINKDONE
C="python3 -u benchmarks/comm.py --sweeps actors --sample-times 0.001 --actors 16,32 --messages 8000"
for v in A D; do run comm_$v $v $C; done
run fig5d_D D python3 -u benchmarks/link_throughput.py --rates unlimited --messages 5000
touch $X/ALLDONE
cd /tmp/tj && PROF_S=30 bash .old_src/profile.sh $X/profile_D 60000 > /dev/null 2>&1
touch $X/PROFDONE
