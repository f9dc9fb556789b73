#!/usr/bin/env bash
# phase 4: B (e60875a) against C (lock-free delivery) at 16 and 32 actors, 3 rounds
X=/tmp/x; export PYTHONPATH=/tmp/site:/tmp/tj
pkill -f ppo_sb3.py; sleep 1
rm -f $X/ALLDONE
job() {
  local name=$1; shift
  local d=$X/$name; mkdir -p $d; uptime > $d/uptime_start.txt; date +%s > $d/t_start
  "$@" > $d/bench.log 2>&1 < /dev/null
  echo $? > $d/rc; uptime > $d/uptime_end.txt; date +%s > $d/t_end; touch $d/DONE
}
C="python3 -u benchmarks/comm.py --sweeps actors --sample-times 0.001 --actors 16,32 --messages 8000"
for r in 1 2 3; do
  job bc_B_r$r env PYTHONPATH=/tmp/site:/tmp/tj bash -c "cd /tmp/tj && $C --out $X/bc_B_r$r"
  job bc_C_r$r env PYTHONPATH=/tmp/site:/tmp/tjC bash -c "cd /tmp/tjC && $C --out $X/bc_C_r$r"
done
job commC_run1 env PYTHONPATH=/tmp/site:/tmp/tjC bash -c "cd /tmp/tjC && python3 -u benchmarks/comm.py --sweeps actors --sample-times 0.001 --max-actors 32 --messages 4000 --out $X/commC_run1"
touch $X/ALLDONE
