#!/usr/bin/env bash
# one lease: Fig. 5d at 512 KiB, one connection, unlimited link: S (HEAD) against R (the tree: the
# receiver takes the rest of a message's arrays in one recvmsg_into) and R4 (R with 4 MiB batches),
# four rounds alternating, three pairs a run; then profiles of R and R4, then comm.py 16 and 32 with R.
source /tmp/tj/.old_src/jobs.sh
rm -rf /tmp/x; X=/tmp/x; mkdir -p $X
mk() { local t=/tmp/tj$1; rm -rf $t; mkdir -p $t; cp -r benchmarks jobqueue $t/; tar xzf .old_src/$1.tgz -C $t; }
mk S; mk R4; rm -f /tmp/tjR; ln -s /tmp/tj /tmp/tjR
{ nproc; cat .old_src/commit.txt; for v in S R R4; do echo "$v: $(grep -c recvmsg_into /tmp/tj$v/tianji_dask/channels/receive_loop.py) $(grep 'max_batch_bytes: int =' /tmp/tj$v/tianji_dask/channels/queue_sender.py)"; done; } > $X/machine.txt 2>&1
L="python3 -u benchmarks/link_throughput.py --rates unlimited --sizes 524288 --messages 10000 --repeats 3"
for r in 1 2 3 4; do for v in S R R4; do run link_${v}_r$r $v $L; done; done
touch $X/LINKDONE
for v in R R4; do job prof_$v env PROF_S=22 PYTHONPATH=/tmp/site:/tmp/tj$v bash -c "cd /tmp/tj$v && bash /tmp/tj/.old_src/profile.sh $X/prof_$v/out 40000"; done
run comm_R R python3 -u benchmarks/comm.py --sweeps actors --sample-times 0.001 --actors 16,32 --messages 8000
touch $X/ALLDONE
