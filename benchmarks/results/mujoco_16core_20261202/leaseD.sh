#!/usr/bin/env bash
cd /tmp/tj; export PYTHONPATH=/tmp/site:/tmp/tj
X=/tmp/x; mkdir -p $X
{ nvidia-smi -L; nproc; git --version; ip -V; tc -V; } > $X/machine.txt 2>&1
job() {
  local name=$1; shift
  local d=$X/$name; mkdir -p $d; uptime > $d/uptime_start.txt; date +%s > $d/t_start
  "$@" > $d/bench.log 2>&1 < /dev/null
  echo $? > $d/rc; uptime > $d/uptime_end.txt; date +%s > $d/t_end; touch $d/DONE
}
for k in 1 2 3; do
  job comm_run$k python3 -u benchmarks/comm.py --sweeps actors --sample-times 0.001 --max-actors 32 --messages 4000 --out $X/comm_run$k
done
job link python3 -u benchmarks/link_throughput.py --messages 500 --out $X/link
job mujoco python3 -u benchmarks/mujoco_1m.py configs/halfcheetah_ppo_16core.yaml --envs HalfCheetah-v5 Hopper-v5 Walker2d-v5 --seeds 0 1 2 --out $X/mujoco --runs $X/mujoco/runs
touch $X/ALLDONE
