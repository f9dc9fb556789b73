#!/usr/bin/env bash
# one lease: a steady Fig. 5d on 16 cores: the unlimited link at 5,000 messages a case, HEAD's
# receive loop alternating with e60875a (A.tgz) three times, then HEAD over 1 Gbit/s at 512 KiB
cd /tmp/tj; export PYTHONPATH=/tmp/site:/tmp/tj
export PATH=/tmp/tj/.ipr/bin:/tmp/site/bin:$PATH LD_LIBRARY_PATH=/tmp/tj/.ipr/lib
X=/tmp/x; mkdir -p $X
mkdir -p /tmp/tjA && tar xzf .old_src/A.tgz -C /tmp/tjA && cp -r benchmarks jobqueue /tmp/tjA/
{ nvidia-smi -L; nproc; cat /tmp/tj/.old_src/commit.txt; python3 -c 'import torch,numpy,sys; print(torch.__version__, numpy.__version__, sys.version)';
  ip netns add tjprobe && ip link add tjv0 type veth peer name tjv1 && ip link set tjv1 netns tjprobe && tc qdisc add dev tjv0 root tbf rate 1gbit burst 1mb latency 50ms && echo NETNS_OK;
  ip link del tjv0; ip netns del tjprobe; } > $X/machine.txt 2>&1
job() {
  local name=$1; shift
  local d=$X/$name; mkdir -p $d; uptime > $d/uptime_start.txt; date +%s > $d/t_start
  "$@" > $d/bench.log 2>&1 < /dev/null
  echo $? > $d/rc; uptime > $d/uptime_end.txt; date +%s > $d/t_end; touch $d/DONE
}
L="python3 -u benchmarks/link_throughput.py --rates unlimited --messages 5000"
for r in 1 2 3; do
  job loop_r$r bash -c "$L --out $X/loop_r$r"
  job A_r$r env PYTHONPATH=/tmp/site:/tmp/tjA bash -c "cd /tmp/tjA && $L --out $X/A_r$r"
done
job gbit_loop python3 -u benchmarks/link_throughput.py --rates 1gbit --sizes 524288 --messages 2000 --out $X/gbit_loop
touch $X/ALLDONE
