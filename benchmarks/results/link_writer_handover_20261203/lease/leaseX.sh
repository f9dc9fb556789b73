#!/usr/bin/env bash
# one lease with the final tree (HEAD in commit.txt): Fig. 5b's 16 and 32 actors three times and
# the 512 KiB unlimited link three times, alternating, for medians.
source /tmp/tj/.old_src/jobs.sh
rm -rf /tmp/x; X=/tmp/x; mkdir -p $X
{ nproc; lscpu | grep -i "model name\|thread(s) per core\|socket(s)"; cat .old_src/commit.txt; } > $X/machine.txt 2>&1
for r in 1 2 3; do
  run comm_r$r "" python3 -u benchmarks/comm.py --sweeps actors --sample-times 0.001 --actors 16,32 --messages 8000
  run link_W_r$r "" python3 -u benchmarks/link_throughput.py --rates unlimited --sizes 524288 --messages 10000 --repeats 3
done
touch $X/ALLDONE
