#!/usr/bin/env bash
# issue 30 on an x2 machine, detached from /tmp/tj: the batch-64 trial, then the race and Fig. 4a-b,
# the two 16-core halves with a GPU each at once. /tmp/x/ALLDONE when over.
cd /tmp/tj; export PYTHONPATH=/tmp/site:/tmp/tj
X=/tmp/x; mkdir -p $X
n=$(nproc); h=$((n/2)); P1="0-$((h-1))"; P2="$h-$((n-1))"
echo "P1 cpus $P1 gpu 0; P2 cpus $P2 gpu 1" > $X/partitions.txt
job() {  # name cpus gpu command... (foreground)
  local name=$1 cpus=$2 gpu=$3; shift 3
  local d=$X/$name; mkdir -p $d; uptime > $d/uptime_start.txt; date +%s > $d/t_start
  CUDA_VISIBLE_DEVICES=$gpu taskset -c $cpus "$@" > $d/bench.log 2>&1 < /dev/null
  echo $? > $d/rc; uptime > $d/uptime_end.txt; touch $d/DONE
}
TTT="python3 -u benchmarks/time_to_target.py configs/pong_dqn.yaml --modes distributed --set stop.target_return=18"
B64="--set algo.batch_size=64 --set algo.train_freq=2 --set algo.buffer_size=100000 --set algo.target_update_interval=500 --set topology.actors=5"
job trial_lr141 $P1 0 $TTT --seeds 61 $B64 --set algo.lr=0.000141421 --set stop.max_seconds=200 --out $X/trial_lr141 --runs $X/trial_lr141/runs &
job trial_lr100 $P2 1 $TTT --seeds 61 $B64 --set algo.lr=0.0001 --set stop.max_seconds=200 --out $X/trial_lr100 --runs $X/trial_lr100/runs &
wait
python3 .old_src/x2_choose.py $X > $X/choice.txt 2>&1
( job race1 $P1 0 python3 -u benchmarks/vs_single.py --config configs/pong_dqn.yaml --seeds 51 --max-seconds 300 \
      --single-max-seconds 720 --threads $h --out $X/race1/out
  job race3 $P1 0 $TTT --seeds 53 --set stop.max_seconds=300 --out $X/race3 --runs $X/race3/runs ) &
( job race2 $P2 1 $TTT --seeds 52 --set stop.max_seconds=300 --out $X/race2 --runs $X/race2/runs
  job fig4ab $P2 1 python3 -u benchmarks/ablation.py --seeds 1 --seconds 300 --set stop.target_return=18 \
      --variant tianji configs/pong_dqn.yaml relaxed --variant apex configs/pong_dqn_apex.yaml relaxed \
      --variant synchronous configs/pong_dqn.yaml synchronous --out $X/fig4ab/out --runs $X/fig4ab/runs ) &
wait
touch $X/ALLDONE
