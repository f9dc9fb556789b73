#!/usr/bin/env bash
# phase 1: SB3 probes, comm A/B matrix, py-spy, comm sweeps x3, netns figures
cd /tmp/tj; export PYTHONPATH=/tmp/site:/tmp/tj
export PATH=/tmp/tj/.ipr/bin:/tmp/site/bin:$PATH LD_LIBRARY_PATH=/tmp/tj/.ipr/lib
X=/tmp/x; mkdir -p $X
mkdir -p /tmp/tjA && tar xzf .old_src/A.tgz -C /tmp/tjA && cp -r benchmarks /tmp/tjA/
{ nvidia-smi -L; nproc; ip -V; tc -V; which py-spy; python3 -c 'import torch,sys; print(torch.__version__, sys.version)';
  ip netns add tjprobe && ip link add tjv0 type veth peer name tjv1 && ip link set tjv1 netns tjprobe && tc qdisc add dev tjv0 root tbf rate 1gbit burst 1mb latency 50ms && echo NETNS_OK;
  ip link del tjv0; ip netns del tjprobe; } > $X/machine.txt 2>&1
job() {
  local name=$1; shift
  local d=$X/$name; mkdir -p $d; uptime > $d/uptime_start.txt; date +%s > $d/t_start
  "$@" > $d/bench.log 2>&1 < /dev/null
  echo $? > $d/rc; uptime > $d/uptime_end.txt; date +%s > $d/t_end; touch $d/DONE
}
SB=/tmp/tj/benchmarks/peers/ppo_sb3.py
job sb3_probe_default python3 -u $SB --env HalfCheetah-v5 --seed 0 --max-env-steps 1000000 --max-seconds 45
job sb3_probe_t1 python3 -u $SB --env HalfCheetah-v5 --seed 0 --max-env-steps 1000000 --max-seconds 45 --threads 1
C="python3 -u benchmarks/comm.py --sweeps actors --sample-times 0.001 --actors 16,32 --messages 8000"
for r in 1 2; do
  for cap in 16 64; do
    job ab_A_cap${cap}_r$r env PYTHONPATH=/tmp/site:/tmp/tjA bash -c "cd /tmp/tjA && $C --capacity-mb $cap --out $X/ab_A_cap${cap}_r$r"
    job ab_B_cap${cap}_r$r bash -c "$C --capacity-mb $cap --out $X/ab_B_cap${cap}_r$r"
  done
done
job pyspy bash .old_src/prof_dev.sh $X/pyspy
for k in 1 2 3; do
  job comm_run$k python3 -u benchmarks/comm.py --sweeps actors --sample-times 0.001 --max-actors 32 --messages 4000 --out $X/comm_run$k
done
if grep -q NETNS_OK $X/machine.txt; then
  job link python3 -u benchmarks/link_throughput.py --messages 500 --out $X/link
  job nodes python3 -u benchmarks/nodes_comm.py --out $X/nodes
fi
touch $X/ALLDONE
