set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:.
nproc; nvidia-smi -L; uptime
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_ppo.py -k cuda 2>&1 | tail -3
rm -rf /tmp/E && mkdir /tmp/E && cp -r configs benchmarks /tmp/E/ && cp -r .old_src/eager/tianji_dask /tmp/E/
ph() { # name dir threads
  (cd $2 && PYTHONPATH=/tmp/site:$2 timeout 90 python3 benchmarks/actor_phases.py configs/pong_ppo.yaml --seconds 10 \
     --set env.atari_threads=$3 --out $OUT/phases/$1 2>&1 | tail -1); uptime
}
ph graphed_t12 $PWD 12
ph eager_t12 /tmp/E 12
ph graphed_t16 $PWD 16
ph eager_t16 /tmp/E 16
rm -rf /tmp/tj /tmp/bench && mkdir -p /tmp/tj /tmp/bench && cp -r tianji_dask configs benchmarks pyproject.toml /tmp/tj/
cd /tmp/tj && PYTHONPATH=/tmp/site:/tmp/tj setsid nohup python3 benchmarks/ppo_vs_single.py --seeds 5 6 7 --max-seconds 200 \
   --out /tmp/bench > /tmp/bench/bench.log 2>&1 < /dev/null &
sleep 5; echo started; cat /tmp/bench/bench.log
