#!/usr/bin/env bash
# the next lease (not run: this stop had no device time left). S (the tree) at 512 KiB, one
# connection, unlimited link: first 40,000 messages under py-spy without stopping the processes
# (per thread, active samples, and GIL holders only, on the sending and the receiving worker:
# profile.sh of ../../link_throughput_16core_20261203/lease/, copied to .old_src/).
source /tmp/tj/.old_src/jobs.sh
rm -rf /tmp/x; X=/tmp/x; mkdir -p $X
{ nproc; cat .old_src/commit.txt; } > $X/machine.txt
job prof_G env PROF_S=22 bash .old_src/profile.sh $X/prof_G/out 40000
touch $X/ALLDONE
