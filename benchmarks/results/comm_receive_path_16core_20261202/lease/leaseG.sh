#!/usr/bin/env bash
# phase 3 (after phase 2's mujoco job): netns figures 5d and 5c, then SB3 for tianji's median wall time
cd /tmp/tj; export PYTHONPATH=/tmp/site:/tmp/tj
export PATH=/tmp/tj/.ipr/bin:/tmp/site/bin:$PATH LD_LIBRARY_PATH=/tmp/tj/.ipr/lib
X=/tmp/x
while [ ! -e $X/mujoco/rc ]; do sleep 2; done
rm -f $X/ALLDONE
job() {
  local name=$1; shift
  local d=$X/$name; mkdir -p $d; uptime > $d/uptime_start.txt; date +%s > $d/t_start
  "$@" > $d/bench.log 2>&1 < /dev/null
  echo $? > $d/rc; uptime > $d/uptime_end.txt; date +%s > $d/t_end; touch $d/DONE
}
rm -rf $X/link $X/nodes
job link python3 -u benchmarks/link_throughput.py --messages 500 --out $X/link
job nodes python3 -u benchmarks/nodes_comm.py --messages 2000 --out $X/nodes
job sb3_113s python3 -u benchmarks/peers/ppo_sb3.py --env HalfCheetah-v5 --seed 0 --max-env-steps 1000000 --max-seconds 113 --threads 1
touch $X/ALLDONE
