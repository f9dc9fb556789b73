#!/usr/bin/env bash
# issue 30, compiled learner, on an x2 machine detached from /tmp/tj: stage 1 the learner alone
# (before/after at batch 64 on half 1, batch 32 on half 2); the choice; stage 2 the race (half 1:
# vs_single seed 81 with a cold compile cache; half 2: seeds 82, 83, then the kernel tables).
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
LT="python3 -u benchmarks/learner_throughput.py configs/pong_dqn.yaml --seconds 4 --repeats 2 --threads 1"
job lt_b64 $P1 0 $LT --variant base . --variant compiled . algo.compile=true --out $X/lt_b64 &
job lt_b32 $P2 1 $LT --set algo.batch_size=32 --variant base . --variant compiled . algo.compile=true --out $X/lt_b32 &
wait
python3 - > $X/choice.txt 2>&1 <<'PY'
import json, statistics
r = json.load(open("/tmp/x/lt_b64/learner_throughput.json"))
print(json.dumps(r)[:3000])
PY
if python3 .old_src/choose_compile.py /tmp/x/lt_b64/learner_throughput.json >> $X/choice.txt 2>&1; then
  sed -i 's/^  updates_per_graph: 8$/  updates_per_graph: 8\n  compile: true/' configs/pong_dqn.yaml
fi
grep -n "compile\|updates_per_graph" configs/pong_dqn.yaml >> $X/choice.txt
TTT="python3 -u benchmarks/time_to_target.py configs/pong_dqn.yaml --modes distributed --set stop.target_return=18 --set stop.max_seconds=300"
( mkdir -p $X/cold_cache; export TORCHINDUCTOR_CACHE_DIR=$X/cold_cache
  job race1 $P1 0 python3 -u benchmarks/vs_single.py --config configs/pong_dqn.yaml --seeds 81 --max-seconds 300 \
      --single-max-seconds 720 --threads $h --out $X/race1/out ) &
( job race2 $P2 1 $TTT --seeds 82 --out $X/race2 --runs $X/race2/runs
  job race3 $P2 1 $TTT --seeds 83 --out $X/race3 --runs $X/race3/runs
  job kern_compiled $P2 1 python3 -u benchmarks/learner_kernels.py configs/pong_dqn.yaml --set algo.compile=true --out $X/kern_compiled
  job kern_base $P2 1 python3 -u benchmarks/learner_kernels.py configs/pong_dqn.yaml --set algo.compile=false --out $X/kern_base ) &
wait
touch $X/ALLDONE
