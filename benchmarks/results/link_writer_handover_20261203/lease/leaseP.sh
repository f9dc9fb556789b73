#!/usr/bin/env bash
# one lease with the final tree (HEAD in commit.txt): the 512 KiB unlimited link twice, then once
# under py-spy without stopping the processes (per thread and GIL holders, both workers).
source /tmp/tj/.old_src/jobs.sh
rm -rf /tmp/x; X=/tmp/x; mkdir -p $X
{ nproc; lscpu | grep -i "model name\|thread(s) per core\|socket(s)"; cat .old_src/commit.txt; } > $X/machine.txt 2>&1
for r in 1 2; do run link_W_r$r "" python3 -u benchmarks/link_throughput.py --rates unlimited --sizes 524288 --messages 10000 --repeats 3; done
job prof_P env PROF_S=22 bash .old_src/profile.sh $X/prof_P/out 40000
touch $X/ALLDONE
