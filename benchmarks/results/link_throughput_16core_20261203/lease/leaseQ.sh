#!/usr/bin/env bash
# one lease: the faster array pickling, straight reads from 16 KiB and sendall of a large rest
# (HEAD) against f15fafd (A.tgz): Fig. 5d unlimited at 5,000 messages, alternating three times;
# comm.py 16 and 32 actors once each; then py-spy on HEAD's 512 KiB case
cd /tmp/tj; export PYTHONPATH=/tmp/site:/tmp/tj
export PATH=/tmp/tj/.ipr/bin:/tmp/site/bin:$PATH LD_LIBRARY_PATH=/tmp/tj/.ipr/lib
X=/tmp/x; mkdir -p $X
mkdir -p /tmp/tjA && tar xzf .old_src/A.tgz -C /tmp/tjA && cp -r benchmarks jobqueue /tmp/tjA/
{ nvidia-smi -L; nproc; cat /tmp/tj/.old_src/commit.txt; } > $X/machine.txt 2>&1
job() {
  local name=$1; shift
  local d=$X/$name; mkdir -p $d; uptime > $d/uptime_start.txt; date +%s > $d/t_start
  "$@" > $d/run.log 2>&1 < /dev/null
  echo $? > $d/rc; uptime > $d/uptime_end.txt; date +%s > $d/t_end; touch $d/DONE
}
L="python3 -u benchmarks/link_throughput.py --rates unlimited --messages 5000"
for r in 1 2 3; do
  job new_r$r bash -c "$L --out $X/new_r$r > $X/new_r$r/bench.log 2>&1"
  job A_r$r env PYTHONPATH=/tmp/site:/tmp/tjA bash -c "cd /tmp/tjA && $L --out $X/A_r$r > $X/A_r$r/bench.log 2>&1"
done
C="python3 -u benchmarks/comm.py --sweeps actors --sample-times 0.001 --actors 16,32 --messages 8000"
job comm_new bash -c "$C --out $X/comm_new > $X/comm_new/bench.log 2>&1"
job comm_A env PYTHONPATH=/tmp/site:/tmp/tjA bash -c "cd /tmp/tjA && $C --out $X/comm_A > $X/comm_A/bench.log 2>&1"
PROF_S=40 job prof512 bash .old_src/profile.sh $X/prof512 60000
touch $X/ALLDONE
