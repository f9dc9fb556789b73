#!/usr/bin/env bash
# phase 2b: tianji-dask HalfCheetah-v5 3 seeds with the oldest-first buffer
cd /tmp/tj; export PYTHONPATH=/tmp/site:/tmp/tj
X=/tmp/x; rm -f $X/ALLDONE
d=$X/mujoco; mkdir -p $d; uptime > $d/uptime_start.txt; date +%s > $d/t_start
python3 -u benchmarks/mujoco_1m.py configs/halfcheetah_ppo_16core.yaml --envs HalfCheetah-v5 --seeds 0 1 2 --out $X/mujoco --runs $X/mujoco/runs > $d/bench.log 2>&1 < /dev/null
echo $? > $d/rc; uptime > $d/uptime_end.txt; date +%s > $d/t_end
touch $X/ALLDONE
