#!/usr/bin/env bash
# one short lease: Fig. 5b (a full actors sweep) and Fig. 5c (4 nodes, 1 ms) with the two-thread receive loop
cd /tmp/tj; export PYTHONPATH=/tmp/site:/tmp/tj
export PATH=/tmp/tj/.ipr/bin:/tmp/site/bin:$PATH LD_LIBRARY_PATH=/tmp/tj/.ipr/lib
X=/tmp/x; mkdir -p $X
{ nproc; cat /tmp/tj/.old_src/commit.txt; } > $X/machine.txt 2>&1
job() {
  local name=$1; shift
  local d=$X/$name; mkdir -p $d; uptime > $d/uptime_start.txt; date +%s > $d/t_start
  "$@" > $d/bench.log 2>&1 < /dev/null
  echo $? > $d/rc; uptime > $d/uptime_end.txt; date +%s > $d/t_end; touch $d/DONE
}
job sweep python3 -u benchmarks/comm.py --sweeps actors --sample-times 0.001 --max-actors 32 --messages 4000 --out $X/sweep
job nodes python3 -u benchmarks/nodes_comm.py --sample-times 0.001 --max-actors 16 --messages 2000 --out $X/nodes
touch $X/ALLDONE
