#!/usr/bin/env bash
# one lease: Fig. 5d at 512 KiB, one connection, unlimited link: D (63ad2cc) against S (the tree:
# the sender takes its socket from tornado too, credit read on a thread of its own), five rounds
# alternating, three pairs a run; then comm.py 16 and 32 actors with S.
source /tmp/tj/.old_src/jobs.sh  # the tree, $X, job and run
mk() { local t=/tmp/tj$1; rm -rf $t; mkdir -p $t; cp -r benchmarks jobqueue $t/; }
mk D; tar xzf .old_src/D.tgz -C /tmp/tjD
ln -s /tmp/tj /tmp/tjS
{ nproc; cat .old_src/commit.txt; for v in D S; do echo "$v: $(grep -c 'read_file' /tmp/tj$v/tianji_dask/channels/queue_sender.py)"; done; } > $X/machine.txt 2>&1
L="python3 -u benchmarks/link_throughput.py --rates unlimited --sizes 524288 --messages 10000 --repeats 3"
for r in 1 2 3 4 5; do for v in D S; do run link_${v}_r$r $v $L; done; done
touch $X/LINKDONE
run comm_S S python3 -u benchmarks/comm.py --sweeps actors --sample-times 0.001 --actors 16,32 --messages 8000
touch $X/ALLDONE
