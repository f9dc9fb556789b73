cd /tmp/tj; export PYTHONPATH=/tmp/site:/tmp/tj
X=/tmp/x; rm -f $X/ALLDONE
job() {
  local name=$1; shift
  local d=$X/$name; mkdir -p $d; uptime > $d/uptime_start.txt; date +%s > $d/t_start
  "$@" > $d/bench.log 2>&1 < /dev/null
  echo $? > $d/rc; uptime > $d/uptime_end.txt; date +%s > $d/t_end; touch $d/DONE
}
for s in 3 4 5; do
  job hc_lag2_s$s python3 -u benchmarks/mujoco_1m.py configs/halfcheetah_ppo_16core.yaml --envs HalfCheetah-v5 --seeds $s --set algo.max_policy_lag=2 --out $X/hc_lag2_s$s --runs $X/hc_lag2_s$s/runs
  job hc_lag1_s$s python3 -u benchmarks/mujoco_1m.py configs/halfcheetah_ppo_16core.yaml --envs HalfCheetah-v5 --seeds $s --out $X/hc_lag1_s$s --runs $X/hc_lag1_s$s/runs
done
touch $X/ALLDONE
