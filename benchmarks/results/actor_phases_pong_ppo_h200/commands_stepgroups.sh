set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:.
nproc; nvidia-smi -L; uptime
rm -rf /tmp/B && mkdir /tmp/B && cp -r tianji_dask configs benchmarks /tmp/B/
sed -i 's|threads = max(1, env_cfg.atari_threads // groups)|threads = env_cfg.atari_threads|' /tmp/B/tianji_dask/envs.py
grep -n "threads = env_cfg.atari_threads" /tmp/B/tianji_dask/envs.py
ph() { # name dir threads groups
  (cd $2 && PYTHONPATH=/tmp/site:$2 timeout 90 python3 benchmarks/actor_phases.py configs/pong_ppo.yaml --seconds 10 \
     --set env.atari_threads=$3 --set env.step_groups=$4 --out $OUT/phases/$1 2>&1 | tail -2); uptime
}
ph split_t16_g1 $PWD 16 1
ph split_t16_g2 $PWD 16 2
ph split_t16_g4 $PWD 16 4
ph shared_t16_g2 /tmp/B 16 2
ph shared_t16_g4 /tmp/B 16 4
ph shared_t12_g4 /tmp/B 12 4
ph split_t12_g1 $PWD 12 1
timeout 200 python3 benchmarks/learner_throughput.py configs/pong_ppo.yaml --seconds 10 --repeats 3 --out $OUT/learner 2>&1 | tail -4
uptime
