#!/usr/bin/env bash
# one lease: Fig. 5d at 512 KiB, one connection, unlimited link: D (fb97a5d, HEAD) against W (the
# tree: a read thread alone with its connection waits for the rest of an array inside one recv,
# MSG_WAITALL, at most 50 ms a call) and W with a 32 MB window (W32), five rounds alternating;
# then comm.py 1, 16 and 32 actors with D and W.
source /tmp/tj/.old_src/jobs.sh  # the tree, $X, job and run
t=/tmp/tjD; rm -rf $t; mkdir -p $t; cp -r benchmarks jobqueue $t/; tar xzf .old_src/D.tgz -C $t
ln -s /tmp/tj /tmp/tjW
{ nproc; cat .old_src/commit.txt; for v in D W; do echo "$v: $(grep -c 'MSG_WAITALL' /tmp/tj$v/tianji_dask/channels/receive_loop.py)"; done; } > $X/machine.txt 2>&1
L="python3 -u benchmarks/link_throughput.py --rates unlimited --sizes 524288 --messages 10000"
for r in 1 2 3 4 5; do for v in D W; do run link_${v}_r$r $v $L; done; run link_W32_r$r W $L --capacity-mb 32; done
C="python3 -u benchmarks/comm.py --sweeps actors --sample-times 0.001 --actors 1,16,32 --messages 8000"
for v in D W; do run comm_$v $v $C; done
touch $X/ALLDONE
