#!/usr/bin/env bash
# issue 30 on one H200, detached from /tmp/tj: CUDA tests, the learner before/blocked/streams at
# batch 32 and 64, the kernel table, then Fig. 4a-b (ablation, 300 s a variant).
cd /tmp/tj; export PYTHONPATH=/tmp/site:/tmp/tj
X=/tmp/x; mkdir -p $X
nvidia-smi -L > $X/gpu.txt 2>&1; nproc >> $X/gpu.txt
job() {  # name command... (foreground)
  local name=$1; shift
  local d=$X/$name; mkdir -p $d; uptime > $d/uptime_start.txt; date +%s > $d/t_start
  "$@" > $d/bench.log 2>&1 < /dev/null
  echo $? > $d/rc; uptime > $d/uptime_end.txt; date +%s > $d/t_end; touch $d/DONE
}
job tests timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_dqn.py tests/test_ppo.py tests/test_atari.py tests/test_networks.py -k "cuda and not two_halves"
LT="python3 -u benchmarks/learner_throughput.py configs/pong_dqn.yaml --seconds 4 --repeats 2 --threads 1"
V="--variant before .old_src/base --variant blocked .old_src/blocked --variant streams ."
job lt_b32 $LT --set algo.batch_size=32 $V --out $X/lt_b32
job lt_b64 $LT $V --out $X/lt_b64
job kern_b32 python3 -u benchmarks/learner_kernels.py configs/pong_dqn.yaml --set algo.batch_size=32 --out $X/kern_b32
job fig4ab python3 -u benchmarks/ablation.py --seeds 1 --seconds 300 --set stop.target_return=18 \
  --variant tianji configs/pong_dqn.yaml relaxed --variant apex configs/pong_dqn_apex.yaml relaxed \
  --variant synchronous configs/pong_dqn.yaml synchronous --out $X/fig4ab --runs $X/fig4ab/runs
touch $X/ALLDONE
