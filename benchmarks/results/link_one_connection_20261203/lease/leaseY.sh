#!/usr/bin/env bash
# one lease: Fig. 5d at 512 KiB, one connection, unlimited link: D (b9879bf: HEAD's channel code)
# against P (the tree: D + receive blocks handed out again once free), four rounds alternating;
# then comm.py 16 and 32 actors with each.
source /tmp/tj/.old_src/jobs.sh  # the tree, $X, job and run
t=/tmp/tjD; rm -rf $t; mkdir -p $t; cp -r benchmarks jobqueue $t/; tar xzf .old_src/D.tgz -C $t
ln -s /tmp/tj /tmp/tjP
{ nproc; cat .old_src/commit.txt; for v in D P; do echo "$v: $(grep -c 'class Blocks' /tmp/tj$v/tianji_dask/channels/receive_loop.py)"; done; } > $X/machine.txt 2>&1
L="python3 -u benchmarks/link_throughput.py --rates unlimited --sizes 524288 --messages 10000"
for r in 1 2 3 4; do for v in D P; do run link_${v}_r$r $v $L; done; done
C="python3 -u benchmarks/comm.py --sweeps actors --sample-times 0.001 --actors 16,32 --messages 8000"
for v in D P; do run comm_$v $v $C; done
touch $X/ALLDONE
