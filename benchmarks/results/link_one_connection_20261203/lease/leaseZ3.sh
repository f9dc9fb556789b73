#!/usr/bin/env bash
# one lease: Fig. 5d at 512 KiB, one connection, unlimited link: D (fb97a5d, HEAD), W (D + a read
# thread alone with its connection waits for an array's rest inside one recv), C (the tree: W +
# credit leaves from the consumer's thread once a quarter of the window is due, even while the
# link's writer lingers) and C32 (C with a 32 MB window), three rounds alternating (C32 two; W not run); then comm.py
# 16 and 32 actors with C. CI: C writing the sender's waits for a batch and its credit messages to logs.
source /tmp/tj/.old_src/jobs.sh  # the tree, $X, job and run
mk() { local t=/tmp/tj$1; rm -rf $t; mkdir -p $t; cp -r benchmarks jobqueue $t/; }
mk D; tar xzf .old_src/D.tgz -C /tmp/tjD

ln -s /tmp/tj /tmp/tjC
{ nproc; cat .old_src/commit.txt; for v in D W C; do echo "$v: $(grep -c 'MSG_WAITALL' /tmp/tj$v/tianji_dask/channels/receive_loop.py) $(grep -c 'its writer lingers' /tmp/tj$v/tianji_dask/channels/queue_inbox.py)"; done; } > $X/machine.txt 2>&1
L="python3 -u benchmarks/link_throughput.py --rates unlimited --sizes 524288 --messages 10000"
for r in 1 2 3; do for v in D C; do run link_${v}_r$r $v $L; done; [ $r -lt 3 ] && run link_C32_r$r C $L --capacity-mb 32; done
mk CI; tar xzf .old_src/CI.tgz -C /tmp/tjCI; rm -f /tmp/wait_log_* /tmp/credit_log_*
run link_CI_r1 CI $L; mkdir -p $X/CI_logs; cp /tmp/wait_log_* /tmp/credit_log_* $X/CI_logs/ 2>/dev/null
touch $X/LINKDONE
run comm_C C python3 -u benchmarks/comm.py --sweeps actors --sample-times 0.001 --actors 16,32 --messages 8000
touch $X/ALLDONE
