#!/usr/bin/env bash
# issues 30 and 34 on one H200, detached from /tmp/tj
cd /tmp/tj; export PYTHONPATH=/tmp/site:/tmp/tj
X=/tmp/x; mkdir -p $X
nvidia-smi -L > $X/gpu.txt 2>&1; nproc >> $X/gpu.txt
job() {  # name command... (foreground)
  local name=$1; shift
  local d=$X/$name; mkdir -p $d; uptime > $d/uptime_start.txt; date +%s > $d/t_start
  "$@" > $d/bench.log 2>&1 < /dev/null
  echo $? > $d/rc; uptime > $d/uptime_end.txt; date +%s > $d/t_end; touch $d/DONE
}
job tests timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_dqn.py tests/test_atari.py tests/test_gaussian_ppo.py tests/test_ppo.py -k "cuda and not two_halves"
LT="python3 -u benchmarks/learner_throughput.py configs/pong_dqn.yaml --seconds 4 --repeats 2 --threads 1"
job lt_b32 $LT --set algo.batch_size=32 --variant before .old_src/before --variant block . --variant block_bf16 . algo.precision=bf16 --out $X/lt_b32
M="python3 -u benchmarks/mujoco_1m.py configs/halfcheetah_ppo_16core.yaml"
job mj_cpu_probe timeout 75 $M --envs HalfCheetah-v5 --seeds 0 --out $X/mj_cpu_probe --runs $X/mj_cpu_probe/runs
job mujoco $M --set learner.device=cuda --envs HalfCheetah-v5 Hopper-v5 Walker2d-v5 --seeds 0 1 2 --out $X/mujoco --runs $X/mujoco/runs
job lt_b64 $LT --variant before .old_src/before --variant block . --out $X/lt_b64
touch $X/ALLDONE
