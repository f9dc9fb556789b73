# On the device machine "one NVIDIA H200, 16 cores" (Python 3.12), 2026-11-29, code of commit
# 2d1a1f0 (the actor on ale-py's asynchronous vector env, env.async_batch 32 of 64 envs);
# packages from .whl as docs/benchmarks.md says. The profile: CPU actors (one core, inference on
# the CPU) at 1 and 2 processes, no learner on the CPU (--max-threads 0), the learner on the GPU,
# and one GPU-inference actor at 1, 2, 4, 8 and 15 env threads. plan.log holds what it printed.
python3 -m tianji_dask.cli plan configs/pong_ppo.yaml --cores 16 --gpus 1 --max-threads 0 --max-actors 2 \
    --out plan.yaml
