#!/usr/bin/env bash
# one lease with the tree (HEAD in commit.txt): the paper's communication figures with the writer
# handed encoded messages: Fig. 5d (five sizes unlimited, 512 KiB over 1 Gbit/s, three pairs
# each), Fig. 5b (1-32 actors at 1 ms into one inbox), Fig. 5c (4 nodes, 1-32 actors at 1 and
# 10 ms); then five more runs of the 512 KiB unlimited case.
source /tmp/tj/.old_src/jobs.sh
rm -rf /tmp/x; X=/tmp/x; mkdir -p $X
{ nproc; lscpu | grep -i "model name\|thread(s) per core\|socket(s)"; cat .old_src/commit.txt; } > $X/machine.txt 2>&1
run fig5d "" python3 -u benchmarks/link_throughput.py --rates unlimited --messages 5000 --repeats 3
run fig5d_gbit "" python3 -u benchmarks/link_throughput.py --rates 1gbit --sizes 524288 --messages 2000 --repeats 3
run fig5b "" python3 -u benchmarks/comm.py --sweeps actors --sample-times 0.001 --max-actors 32 --messages 4000
run fig5c "" python3 -u benchmarks/nodes_comm.py --sample-times 0.001,0.01 --max-actors 32 --messages 2000
touch $X/FIGDONE
for r in 1 2 3 4 5; do
  run link_W_r$r "" python3 -u benchmarks/link_throughput.py --rates unlimited --sizes 524288 --messages 10000 --repeats 3
done
touch $X/ALLDONE
