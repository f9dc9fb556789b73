#!/usr/bin/env bash
# one lease with the final tree (HEAD in commit.txt): the 512 KiB unlimited link four times on a
# quiet machine, then a comm.py run of 16 and 32 actors, then the link twice more right after it.
source /tmp/tj/.old_src/jobs.sh
rm -rf /tmp/x; X=/tmp/x; mkdir -p $X
{ nproc; lscpu | grep -i "model name\|thread(s) per core\|socket(s)"; cat .old_src/commit.txt; } > $X/machine.txt 2>&1
L="python3 -u benchmarks/link_throughput.py --rates unlimited --sizes 524288 --messages 10000 --repeats 3"
for r in 1 2 3 4; do run link_W_r$r "" $L; done
run comm "" python3 -u benchmarks/comm.py --sweeps actors --sample-times 0.001 --actors 16,32 --messages 8000
for r in 5 6; do run link_W_r$r "" $L; done
touch $X/ALLDONE
