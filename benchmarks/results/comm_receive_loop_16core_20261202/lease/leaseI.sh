#!/usr/bin/env bash
# one lease: the one-thread receive loop (HEAD) on 16 cores against e60875a (A.tgz), Fig. 5b sweeps,
# Fig. 5d, then HalfCheetah x3 with max_policy_lag 2 (a late rollout kept, weight clipped), then lag 1
cd /tmp/tj; export PYTHONPATH=/tmp/site:/tmp/tj
export PATH=/tmp/tj/.ipr/bin:/tmp/site/bin:$PATH LD_LIBRARY_PATH=/tmp/tj/.ipr/lib
X=/tmp/x; mkdir -p $X
mkdir -p /tmp/tjA && tar xzf .old_src/A.tgz -C /tmp/tjA && cp -r benchmarks /tmp/tjA/
{ nvidia-smi -L; nproc; cat /tmp/tj/.old_src/commit.txt; python3 -c 'import torch,sys; print(torch.__version__, sys.version)';
  ip netns add tjprobe && ip link add tjv0 type veth peer name tjv1 && ip link set tjv1 netns tjprobe && tc qdisc add dev tjv0 root tbf rate 1gbit burst 1mb latency 50ms && echo NETNS_OK;
  ip link del tjv0; ip netns del tjprobe; } > $X/machine.txt 2>&1
job() {
  local name=$1; shift
  local d=$X/$name; mkdir -p $d; uptime > $d/uptime_start.txt; date +%s > $d/t_start
  "$@" > $d/bench.log 2>&1 < /dev/null
  echo $? > $d/rc; uptime > $d/uptime_end.txt; date +%s > $d/t_end; touch $d/DONE
}
C="python3 -u benchmarks/comm.py --sweeps actors --sample-times 0.001 --actors 16,32 --messages 8000"
for r in 1 2; do
  job ab_loop_r$r bash -c "$C --out $X/ab_loop_r$r"
  job ab_A_r$r env PYTHONPATH=/tmp/site:/tmp/tjA bash -c "cd /tmp/tjA && $C --out $X/ab_A_r$r"
done
for k in 1 2 3; do
  job comm_run$k python3 -u benchmarks/comm.py --sweeps actors --sample-times 0.001 --max-actors 32 --messages 4000 --out $X/comm_run$k
done
grep -q NETNS_OK $X/machine.txt && job link python3 -u benchmarks/link_throughput.py --messages 500 --out $X/link
job hc_lag2 python3 -u benchmarks/mujoco_1m.py configs/halfcheetah_ppo_16core.yaml --envs HalfCheetah-v5 --seeds 0 1 2 --set algo.max_policy_lag=2 --out $X/hc_lag2 --runs $X/hc_lag2/runs
job hc_lag1 python3 -u benchmarks/mujoco_1m.py configs/halfcheetah_ppo_16core.yaml --envs HalfCheetah-v5 --seeds 0 1 2 --out $X/hc_lag1 --runs $X/hc_lag1/runs
touch $X/ALLDONE
