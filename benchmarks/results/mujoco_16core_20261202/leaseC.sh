#!/usr/bin/env bash
cd /tmp/tj; export PYTHONPATH=/tmp/site:/tmp/tj
X=/tmp/x; mkdir -p $X
nvidia-smi -L > $X/gpu.txt 2>&1; nproc >> $X/gpu.txt
job() {
  local name=$1; shift
  local d=$X/$name; mkdir -p $d; uptime > $d/uptime_start.txt; date +%s > $d/t_start
  "$@" > $d/bench.log 2>&1 < /dev/null
  echo $? > $d/rc; uptime > $d/uptime_end.txt; date +%s > $d/t_end; touch $d/DONE
}
LT="python3 -u benchmarks/learner_throughput.py configs/pong_dqn.yaml --seconds 4 --repeats 2 --threads 1"
job lt_b32_fixed $LT --set algo.batch_size=32 --variant before .old_src/before --variant block . --variant block_bf16 . algo.precision=bf16 --out $X/lt_b32_fixed
M="python3 -u benchmarks/mujoco_1m.py configs/halfcheetah_ppo_16core.yaml --set learner.device=cuda"
job mujoco_hc $M --envs HalfCheetah-v5 --seeds 1 2 --out $X/mujoco_hc --runs $X/mujoco_hc/runs
job mujoco_hw $M --envs Hopper-v5 Walker2d-v5 --seeds 0 --out $X/mujoco_hw --runs $X/mujoco_hw/runs
touch $X/ALLDONE
