#!/usr/bin/env bash
# issue 30 on one H200, detached from /tmp/tj: CUDA tests, the learner at batch 32 before/after,
# the race (3 seeds), then batch 64 and the kernel table if time is left.
cd /tmp/tj; export PYTHONPATH=/tmp/site:/tmp/tj
X=/tmp/x; mkdir -p $X
nvidia-smi -L > $X/gpu.txt 2>&1; nproc >> $X/gpu.txt; git -C /tmp/tj log -1 2>/dev/null >> $X/gpu.txt
job() {  # name command... (foreground)
  local name=$1; shift
  local d=$X/$name; mkdir -p $d; uptime > $d/uptime_start.txt; date +%s > $d/t_start
  "$@" > $d/bench.log 2>&1 < /dev/null
  echo $? > $d/rc; uptime > $d/uptime_end.txt; date +%s > $d/t_end; touch $d/DONE
}
job tests timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_dqn.py tests/test_ppo.py tests/test_atari.py -k "cuda and not two_halves"
LT="python3 -u benchmarks/learner_throughput.py configs/pong_dqn.yaml --seconds 4 --repeats 2 --threads 1"
job lt_b32 $LT --set algo.batch_size=32 --variant before .old_src/base --variant after . --out $X/lt_b32
TTT="python3 -u benchmarks/time_to_target.py configs/pong_dqn.yaml --modes distributed --set stop.target_return=18 --set stop.max_seconds=240"
for s in 85 86 87; do job race$s $TTT --seeds $s --out $X/race$s --runs $X/race$s/runs; done
job lt_b64 $LT --variant before .old_src/base --variant after . --out $X/lt_b64
job kern_b32 python3 -u benchmarks/learner_kernels.py configs/pong_dqn.yaml --set algo.batch_size=32 --out $X/kern_b32
touch $X/ALLDONE
