#!/usr/bin/env bash
# one lease: Fig. 5d at 512 KiB, one connection, unlimited link: D (fb97a5d, HEAD), W (the tree: a
# read thread alone with its connection waits for an array's rest inside one recv), W2 and W4 (W
# with max_batch_bytes 2 MiB and 4 MiB), five rounds alternating; then a py-spy profile of W.
source /tmp/tj/.old_src/jobs.sh  # the tree, $X, job and run
mk() { local t=/tmp/tj$1; rm -rf $t; mkdir -p $t; cp -r benchmarks jobqueue $t/; }
mk D; tar xzf .old_src/D.tgz -C /tmp/tjD
for v in W2:2 W4:4; do
  IFS=: read name batch <<< "$v"; mk $name; cp -r tianji_dask /tmp/tj$name/
  sed -i "s/max_batch_bytes: int = 1 << 20,/max_batch_bytes: int = $batch << 20,/" /tmp/tj$name/tianji_dask/channels/queue_sender.py
done
ln -s /tmp/tj /tmp/tjW
{ nproc; lscpu | grep -i "model name\|socket\|thread"; cat .old_src/commit.txt; for v in D W W2 W4; do echo "$v: $(grep -c 'MSG_WAITALL' /tmp/tj$v/tianji_dask/channels/receive_loop.py) $(grep -h 'max_batch_bytes: int' /tmp/tj$v/tianji_dask/channels/queue_sender.py)"; done; } > $X/machine.txt 2>&1
L="python3 -u benchmarks/link_throughput.py --rates unlimited --sizes 524288 --messages 10000"
for r in 1 2 3 4 5; do for v in D W W2 W4; do run link_${v}_r$r $v $L; done; done
touch $X/ALLDONE
cd /tmp/tj && PROF_S=20 bash .old_src/profile.sh $X/profile_W 40000 > /dev/null 2>&1
touch $X/PROFDONE
