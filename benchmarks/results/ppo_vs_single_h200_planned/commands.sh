# Same lease as ../plan_pong_ppo_h200 (one NVIDIA H200, 16 cores), right after the plan: the
# race of configs/pong_ppo.yaml with the plan's fields (env.atari_threads 15 instead of 12; the
# rest as the config had it) against the single-process script, detached and polled. The lease's
# device time ran out during the single process's seed 7, so that run is missing.
python3 -m tianji_dask.cli plan configs/pong_ppo.yaml --cores 16 --gpus 1 --max-threads 0 --max-actors 2 --out plan.yaml
python3 benchmarks/ppo_vs_single.py --seeds 5 6 7 --max-seconds 200 \
    --set topology.groups=1 --set topology.actors=1 --set topology.learners=1 \
    --set topology.learner_threads=1 --set learner.device=cuda --set actor.device=cuda \
    --set env.atari_threads=15 --out /tmp/bench
