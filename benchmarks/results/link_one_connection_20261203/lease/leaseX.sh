#!/usr/bin/env bash
# one lease with the tree (HEAD in commit.txt): Fig. 5d (five sizes unlimited, 512 KiB over
# 1 Gbit/s), Fig. 5b at 16 and 32 actors (1 ms), Fig. 5c over 4 nodes to 32 actors at 1 and 10 ms
cd /tmp/tj; export PYTHONPATH=/tmp/site:/tmp/tj
export PATH=/tmp/tj/.ipr/bin:/tmp/site/bin:$PATH LD_LIBRARY_PATH=/tmp/tj/.ipr/lib
X=/tmp/x; mkdir -p $X
{ nproc; lscpu | grep -i "model name"; cat .old_src/commit.txt; } > $X/machine.txt 2>&1
job() {
  local name=$1; shift
  local d=$X/$name; mkdir -p $d; uptime > $d/uptime_start.txt; date +%s > $d/t_start
  "$@" --out $d > $d/bench.log 2>&1 < /dev/null
  echo $? > $d/rc; uptime > $d/uptime_end.txt; date +%s > $d/t_end; touch $d/DONE
}
job fig5d python3 -u benchmarks/link_throughput.py --rates unlimited --messages 5000
job fig5d_gbit python3 -u benchmarks/link_throughput.py --rates 1gbit --sizes 524288 --messages 2000
job fig5b python3 -u benchmarks/comm.py --sweeps actors --sample-times 0.001 --actors 16,32 --messages 8000
job fig5c python3 -u benchmarks/nodes_comm.py --sample-times 0.001,0.01 --max-actors 32 --messages 2000
touch $X/ALLDONE
