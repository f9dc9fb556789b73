#!/usr/bin/env bash
# one lease: Fig. 5d at 512 KiB, one connection, unlimited link: S (631bb9d: the sender owns its
# socket, credit read on a thread of its own) against B (the tree: one thread writes and reads
# the credit between batches), four rounds alternating, three pairs a run; then comm.py 16 and 32
# actors with B.
source /tmp/tj/.old_src/jobs.sh
mk() { local t=/tmp/tj$1; rm -rf $t; mkdir -p $t; cp -r benchmarks jobqueue $t/; }
mk S; tar xzf .old_src/S.tgz -C /tmp/tjS
ln -s /tmp/tj /tmp/tjB
{ nproc; cat .old_src/commit.txt; for v in S B; do echo "$v: $(grep -c '_serve_socket' /tmp/tj$v/tianji_dask/channels/queue_sender.py)"; done; } > $X/machine.txt 2>&1
L="python3 -u benchmarks/link_throughput.py --rates unlimited --sizes 524288 --messages 10000 --repeats 3"
for r in 1 2 3 4; do for v in S B; do run link_${v}_r$r $v $L; done; done
touch $X/LINKDONE
run comm_B B python3 -u benchmarks/comm.py --sweeps actors --sample-times 0.001 --actors 16,32 --messages 8000
touch $X/ALLDONE
