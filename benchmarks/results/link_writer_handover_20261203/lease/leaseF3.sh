#!/usr/bin/env bash
# one lease with the tree (HEAD in commit.txt): Fig. 5d's five sizes on the unlimited link twice
# (three pairs each), with only items of half a batch or more handed to the writer encoded.
source /tmp/tj/.old_src/jobs.sh
rm -rf /tmp/x; X=/tmp/x; mkdir -p $X
{ nproc; lscpu | grep -i "model name\|thread(s) per core\|socket(s)"; cat .old_src/commit.txt; } > $X/machine.txt 2>&1
for r in 1 2; do
  run fig5d_r$r "" python3 -u benchmarks/link_throughput.py --rates unlimited --messages 5000 --repeats 3
done
touch $X/ALLDONE
