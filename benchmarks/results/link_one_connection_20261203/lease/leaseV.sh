#!/usr/bin/env bash
# one lease: Fig. 5d at 512 KiB, one connection, unlimited link: D (9f9b11e + one lock turn a
# written message) against F (the tree: D + an encoder thread that takes and encodes ahead of the
# writer thread), four rounds alternating; comm.py 16 and 32 actors with each; py-spy of F.
source /tmp/tj/.old_src/jobs.sh  # the tree, $X, job and run
t=/tmp/tjD; rm -rf $t; mkdir -p $t; cp -r benchmarks jobqueue $t/; tar xzf .old_src/D.tgz -C $t
ln -s /tmp/tj /tmp/tjF
{ nproc; cat .old_src/commit.txt; for v in D F; do echo "$v: $(grep -c '_encode_loop' /tmp/tj$v/tianji_dask/channels/queue_sender.py)"; done; } > $X/machine.txt 2>&1
L="python3 -u benchmarks/link_throughput.py --rates unlimited --sizes 524288 --messages 10000"
for r in 1 2 3 4; do for v in D F; do run link_${v}_r$r $v $L; done; done
touch $X/LINKDONE
C="python3 -u benchmarks/comm.py --sweeps actors --sample-times 0.001 --actors 16,32 --messages 8000"
for v in D F; do run comm_$v $v $C; done
touch $X/ALLDONE
cd /tmp/tj && PROF_S=30 bash .old_src/profile.sh $X/profile_F 60000 > /dev/null 2>&1
cd $X/profile_F && gzip -f *.txt
touch $X/PROFDONE
