#!/usr/bin/env bash
# one lease: Fig. 5d at 512 KiB, one connection, unlimited link: S (the tree, 631bb9d) against S2
# (S with 2 MiB batches by default instead of 1 MiB), five rounds alternating, three pairs a run.
source /tmp/tj/.old_src/jobs.sh
mk() { local t=/tmp/tj$1; rm -rf $t; mkdir -p $t; cp -r benchmarks jobqueue tianji_dask $t/; }
mk S2; sed -i 's/max_batch_bytes: int = 1 << 20,/max_batch_bytes: int = 2 << 20,/' /tmp/tjS2/tianji_dask/channels/queue_sender.py
ln -s /tmp/tj /tmp/tjS
{ nproc; cat .old_src/commit.txt; for v in S S2; do echo "$v: $(grep 'max_batch_bytes: int' /tmp/tj$v/tianji_dask/channels/queue_sender.py)"; done; } > $X/machine.txt 2>&1
L="python3 -u benchmarks/link_throughput.py --rates unlimited --sizes 524288 --messages 10000 --repeats 3"
for r in 1 2 3 4 5; do for v in S S2; do run link_${v}_r$r $v $L; done; done
touch $X/ALLDONE
