# On the device machine "one NVIDIA H200, 16 cores" (Python 3.12, torch 2.11), 2026-11-27, code of
# this commit; packages from .whl as docs/benchmarks.md says. The profile: CPU actors (one core,
# inference on the CPU) at 1 and 2 processes (a PPO group holds one actor: max_policy_lag 1 x
# rollouts_per_update 1), no learner on the CPU (--max-threads 0: one of its 8,192-sample
# iterations takes about 50 s there), the learner on the GPU, and one GPU-inference actor at
# 1, 2, 4, 8 and 15 env threads. plan.log holds what it printed.
python3 -m tianji_dask.cli plan configs/pong_ppo.yaml --cores 16 --gpus 1 --max-threads 0 --max-actors 2 \
    --out plan.yaml
