"""Where a PPO actor's time goes: the policy's inference, the env's step, and the rest (frame
streams, episode statistics, training signals, rollout bookkeeping), per vector step.

    python benchmarks/actor_phases.py configs/pong_ppo.yaml --seconds 20
    python benchmarks/actor_phases.py configs/pong_ppo_small.yaml --set actor.device=cpu

One real PPO actor role in this process (the config's: :class:`~tianji_dask.algos.ppo.actor.PPOActorRole`,
or with ``env.async_batch`` :class:`~tianji_dask.algos.ppo.async_actor.PPOAsyncActorRole`), no cluster: it
pushes its rollouts into a local queue that is drained (and dropped) as they arrive, with the
parameters of a freshly initialised policy. Every call of ``policy.act``, ``policy.value`` and
of each step group's ``step``/``send``/``recv`` is timed (the GPU work inside ``act`` included:
it returns numpy; where the envs step in two calls, ``env`` is the time spent sending and
waiting for them: the rest of a step overlaps the emulators unless ``--in-turn``).
Writes ``<out>/actor_phases.json`` and prints env steps/s and each phase's share.

``--learner-beside process`` (or ``thread``) trains a PPO learner of the config on synthetic
Atari batches beside the actor, in another process (as a run places them: the GPU time-sliced
between two CUDA contexts) or in a thread of the actor's (one context, one GIL), busy
``--learner-busy`` of the time (a run's ``train_busy``): what sharing the learner's GPU costs
the actor.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, NamedTuple

LEARNER_ACTIONS = 6  # Pong's: the learner beside trains on synthetic batches of this many actions


def learner_beside(config: str, overrides: list[str], busy: float, stop, iterations) -> None:
    """Train a PPO learner of ``config`` on a synthetic Atari batch of its rollout's size until
    ``stop`` is set, waiting after each iteration so that it is busy ``busy`` of the time;
    ``iterations.value`` counts them."""
    import torch
    from learner_direct import atari_batch

    from tianji_dask.algos.ppo.core import PPOLearner
    from tianji_dask.config import load_config

    cfg = load_config(config, overrides)
    torch.set_num_threads(cfg.topology.learner_torch_threads)
    batch = atari_batch(cfg.algo.rollout_steps * cfg.env.num_envs * cfg.algo.rollouts_per_update, seed=0)
    learner = PPOLearner(0, LEARNER_ACTIONS, cfg.algo, seed=0, device=cfg.learner.device, network="nature_cnn")
    while not stop.is_set():
        t = time.perf_counter()
        learner.train(batch)
        if learner.device.type == "cuda":
            torch.cuda.synchronize()
        iterations.value += 1
        stop.wait((time.perf_counter() - t) * (1.0 / busy - 1.0))


def timed(obj, name: str, totals: dict[str, float], label: str) -> None:
    fn = getattr(obj, name)

    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[label] += time.perf_counter() - t

    setattr(obj, name, wrapper)


def timed_halves(obj, name: str, totals: dict[str, float], label: str) -> None:
    """Times a call that launches work and returns the call that waits for it (``act_async``):
    the launch and the wait count, the host's work in between does not."""
    launch = getattr(obj, name)

    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        wait = launch(*args, **kwargs)
        totals[label] += time.perf_counter() - t

        def timed_wait():
            t = time.perf_counter()
            try:
                return wait()
            finally:
                totals[label] += time.perf_counter() - t

        return timed_wait

    setattr(obj, name, wrapper)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--seconds", type=float, default=20.0, help="measured time after warm-up (default 20)")
    p.add_argument(
        "--in-turn",
        action="store_true",
        help="choose each step's actions after the previous step's bookkeeping, as envs without "
        "send/recv do (default with ale-py: before it, while the emulators run)",
    )
    p.add_argument(
        "--learner-beside",
        choices=["none", "process", "thread"],
        default="none",
        help="a PPO learner training beside the actor, in another process or a thread of this one",
    )
    p.add_argument("--learner-busy", type=float, default=1.0, help="the learner's busy fraction, in (0, 1] (default 1)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/actor_phases"))
    a = p.parse_args(argv)
    if not Path(a.config).is_file():
        p.error(f"config {a.config} does not exist; pass a config file such as configs/pong_ppo.yaml")
    if not 0.0 < a.learner_busy <= 1.0:
        p.error(f"--learner-busy {a.learner_busy} is not in (0, 1]: pass a fraction such as 0.35")

    import torch

    from tianji_dask.algos.ppo.spec import PPOSpec
    from tianji_dask.channels import LocalQueue, LocalTopic
    from tianji_dask.config import load_config
    from tianji_dask.config.schema import PPOConfig

    cfg = load_config(a.config, a.overrides)
    if not isinstance(cfg.algo, PPOConfig):
        p.error(f"{a.config} is not a PPO config (algo.name: {cfg.algo.name})")
    torch.set_num_threads(cfg.topology.torch_threads)
    queue, topic = LocalQueue(capacity_bytes=1 << 34), LocalTopic()
    actor = PPOSpec().make_actor(cfg, 0, cfg.seed, queue, topic.subscribe(), n_actors=1, balance=False)
    # the actor's own freshly initialised weights, as a learner's first version would be
    topic.publish(0, {"params": {k: v.cpu().numpy() for k, v in actor.policy.net.state_dict().items()}})
    actor.wait_for_params(5.0)
    actor.chooses_ahead &= not a.in_turn

    totals: dict[str, float] = defaultdict(float)
    for name, label in (("act", "inference"), ("value", "inference")):
        timed(actor.policy, name, totals, label)
    if cfg.env.async_batch and actor.policy.device.type == "cuda":
        # the asynchronous actor launches its inference and waits for it later (on the CPU,
        # act_async is act, timed above)
        timed_halves(actor.policy, "act_async", totals, "inference")
    # the step groups' vector envs, or the one asynchronous env (env.async_batch)
    groups = getattr(actor.env, "envs", [actor.env])
    two_calls = actor.chooses_ahead or cfg.env.async_batch > 0 or (len(groups) > 1 and hasattr(groups[0], "send"))
    for env in groups:  # ale-py's step calls its own send: time either step or send and recv
        for name in ("send", "recv") if two_calls else ("step",):
            timed(env, name, totals, "env")

    def run(seconds: float) -> tuple[int, float]:
        start_steps, t0 = actor.counters.env_steps, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            actor.step()
            queue.poll()  # rollouts are dropped here: only the actor is measured
        return actor.counters.env_steps - start_steps, time.perf_counter() - t0

    beside = start_learner_beside(a) if a.learner_beside != "none" else None
    run(3.0)  # warm-up: CUDA context, cuDNN, first rollouts (and the learner's first iterations)
    totals.clear()
    counted = beside.iterations.value if beside else 0
    steps, wall = run(a.seconds)
    learner_iterations = (beside.iterations.value - counted) if beside else 0
    if beside:
        beside.stop.set()
        beside.worker.join(120)
    phases = {k: v / wall for k, v in totals.items()}
    phases["rest"] = 1.0 - sum(phases.values())
    result = {
        "config": a.config,
        "overrides": a.overrides,
        "chooses_ahead": actor.chooses_ahead,
        "env_steps_per_s": steps / wall,
        "ms_per_vector_step": 1000 * wall / (steps / actor.num_envs),
        "share": phases,
        "load_1min": os.getloadavg()[0],
        "cpus": os.cpu_count(),
        "device": cfg.actor.device,
        "learner_beside": a.learner_beside,
        "learner_busy": a.learner_busy if beside else 0.0,
        "learner_iterations_per_s": learner_iterations / wall,
    }
    actor.close()
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "actor_phases.json").write_text(json.dumps(result, indent=2))
    print(
        f"{result['env_steps_per_s']:,.0f} env steps/s, {result['ms_per_vector_step']:.2f} ms per vector step: "
        + ", ".join(f"{k} {v:.0%}" for k, v in phases.items())
        + (f"; learner beside: {result['learner_iterations_per_s']:.2f} iterations/s" if beside else "")
    )
    return 0


class Beside(NamedTuple):
    worker: Any  # the learner's process or thread
    stop: Any  # its stop event
    iterations: Any  # its iteration count (.value)


def start_learner_beside(a) -> Beside:
    """The learner beside the actor, started; waits for its first iteration, so that building
    it is not timed."""
    import multiprocessing
    import threading

    if a.learner_beside == "process":
        ctx = multiprocessing.get_context("spawn")
        stop, iterations = ctx.Event(), ctx.Value("l", 0)
        worker = ctx.Process(target=learner_beside, args=(a.config, a.overrides, a.learner_busy, stop, iterations))
    else:

        class Count:
            value = 0

        stop, iterations = threading.Event(), Count()
        worker = threading.Thread(target=learner_beside, args=(a.config, a.overrides, a.learner_busy, stop, iterations))
    worker.start()
    deadline = time.monotonic() + 300
    while iterations.value == 0:
        if not worker.is_alive() or time.monotonic() > deadline:
            code = getattr(worker, "exitcode", None)
            raise SystemExit(f"the learner beside the actor did not train (exit code {code})")
        time.sleep(0.05)
    return Beside(worker, stop, iterations)


if __name__ == "__main__":
    raise SystemExit(main())
