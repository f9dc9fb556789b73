#!/usr/bin/env bash
# one lease: Fig. 5d at 512 KiB, one connection, unlimited link: S (HEAD, 1 MiB batches) against
# M (the tree, with 512 KiB batches: one 512 KiB item a message), five rounds alternating, three
# pairs a run; then comm.py 16 and 32 actors with M, then a profile of M.
source /tmp/tj/.old_src/jobs.sh
rm -rf /tmp/x; X=/tmp/x; mkdir -p $X
mk() { local t=/tmp/tj$1; rm -rf $t; mkdir -p $t; cp -r benchmarks jobqueue $t/; tar xzf .old_src/$1.tgz -C $t; }
mk S; mk M
{ nproc; cat .old_src/commit.txt; for v in S M; do echo "$v: $(grep -c recvmsg_into /tmp/tj$v/tianji_dask/channels/receive_loop.py) $(grep 'max_batch_bytes: int =' /tmp/tj$v/tianji_dask/channels/queue_sender.py)"; done; } > $X/machine.txt 2>&1
L="python3 -u benchmarks/link_throughput.py --rates unlimited --sizes 524288 --messages 10000 --repeats 3"
for r in 1 2 3 4 5; do for v in S M; do run link_${v}_r$r $v $L; done; done
touch $X/LINKDONE
run comm_M M python3 -u benchmarks/comm.py --sweeps actors --sample-times 0.001 --actors 16,32 --messages 8000
job prof_M env PROF_S=22 PYTHONPATH=/tmp/site:/tmp/tjM bash -c "cd /tmp/tjM && bash /tmp/tj/.old_src/profile.sh $X/prof_M/out 40000"
touch $X/ALLDONE
