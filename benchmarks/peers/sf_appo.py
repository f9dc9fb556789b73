"""Sample Factory 2's APPO with its own published settings, timed to a 100-episode mean return
(Atari: Pong to 18) or run for a budget of env steps (MuJoCo: HalfCheetah-v5, 1M), printing the
record of ``time_to_target_record.py`` as its last line. Runs in its own environment, apart from
tianji-dask's (it imports nothing of the project): python3 -m venv .venv-sf;
.venv-sf/bin/pip install torch==2.13.0 sample-factory==2.1.1 gymnasium ale-py (add
'gymnasium[mujoco]' for HalfCheetah); ``sf_compat.py`` beside it patches what today's numpy and
gymnasium changed under Sample Factory 2.1.1, at run time.

    python sf_appo.py --env atari_pong --seed 1 --target 18 --max-seconds 600 --workers 16
    python sf_appo.py --env HalfCheetah-v5 --seed 1 --max-env-steps 1000000 --workers 16
    python sf_appo.py --env CartPole-v1 --max-seconds 20 --workers 2 --device cpu    # a smoke run

The settings are Sample Factory's own, read from the installed package (PyPI's sample-factory
2.1.1 = alex-petrenko/sample-factory tag v2.1.1, commit 91e5893614759d5d73f4949ec654fa59201ab7b2;
both files are unchanged at master 1894bd1e of 2025-11-14), with ``--algo=APPO`` as its docs and
launcher scripts run them, unchanged except ``num_workers`` (``--workers``, the machine's cores)
and, for synchronous settings with more workers than the 8 they are sized for, as many more
minibatches an iteration as Sample Factory then needs (:func:`fit_to_workers`):

* ``--settings atari`` (Atari ids such as ``atari_pong``): ``sf_examples/atari/atari_params.py``
  ``atari_override_defaults``, the settings of ``sf_examples/atari/experiments/atari_envs.py``,
  which runs Pong among its three games; chosen, its docs say, to match CleanRL's ppo_atari
  (synchronous: ``async_rl=False``, 1 env per worker, rollout 128, minibatches of 256, 4 epochs,
  lr 2.5e-4 decayed linearly over ``train_for_env_steps`` 10M frames). The envs are
  ``sf_examples/atari/atari_utils.py``'s: ``PongNoFrameskip-v4`` with no-op reset, frame skip 4
  with max-pooling, episodic life, fire reset, reward clipping, 84x84 grayscale, 4 frames stacked.
* ``--settings atari_faster``: the same plus the "Better parameters (more envs, double buffering,
  async learning)" of ``docs/09-environment-integrations/atari.md`` (published for Breakout):
  ``async_rl=True``, 8 envs per worker in 2 splits, rollout 32, batch 1024,
  ``summaries_use_frameskip=False`` (its ``train_for_env_steps`` 1e8 and wandb flags left out).
* ``--settings mujoco`` (any other gymnasium id: HalfCheetah-v5, and Pendulum-v1 or CartPole-v1
  for smoke runs): ``sf_examples/mujoco/mujoco_params.py`` ``mujoco_override_defaults``
  (synchronous, 8 envs per worker in 2 splits, rollout 64, batch 1024, MLP 64x64 tanh, lr 2.95e-3
  decayed over 10M steps). Sample Factory's MuJoCo envs are the -v4 tasks; here the id is made by
  ``gym.make`` as theirs are (``mujoco_utils.make_mujoco_env``), so HalfCheetah is -v5 as
  tianji-dask's.

The step budget (``--max-env-steps``) and the time cap (``--max-seconds``) stop the run from an
``AlgoObserver`` after a training iteration, through Sample Factory's own end-of-training check, so
the settings' ``train_for_env_steps`` (and with it the learning-rate decay) stay as published; a run
also ends where those settings end it. Episode returns come from Sample Factory's episodic-stats
hook (``Runner.register_episodic_stats_handler``): the raw full-game return of gymnasium's
``RecordEpisodeStatistics`` where the env has it (the Atari envs, under reward clipping and
episodic life: the same return tianji-dask records; the gymnasium ids get that wrapper too).

Env steps, as tianji-dask counts them: one step of the policy (on Atari one agent step, 4
emulator frames). Sample Factory counts the steps its learner trained on, times the frame skip
where ``summaries_use_frameskip`` is on (the Atari settings: frames); the record divides that
back out (``env_steps``) and keeps Sample Factory's figure as ``sf_env_steps``. The clock starts
just before the runner is built (imports excluded, as tianji-dask's and stable-baselines3's).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import sf_compat
from time_to_target_record import TimeToTarget, print_record

PATCHES = sf_compat.apply()  # at import: Sample Factory's spawned workers import this module too

SOURCE = "alex-petrenko/sample-factory v2.1.1 (91e5893614759d5d73f4949ec654fa59201ab7b2)"
SETTINGS_FILES = {
    "atari": "sf_examples/atari/atari_params.py atari_override_defaults",
    "atari_faster": "sf_examples/atari/atari_params.py + docs/09-environment-integrations/atari.md 'Better parameters'",
    "mujoco": "sf_examples/mujoco/mujoco_params.py mujoco_override_defaults",
}
#: docs/09-environment-integrations/atari.md, "Better parameters", less experiment, wandb and budget
ATARI_FASTER = {
    "summaries_use_frameskip": False,
    "num_envs_per_worker": 8,
    "worker_num_splits": 2,
    "rollout": 32,
    "normalize_input": True,
    "normalize_returns": True,
    "serial_mode": False,
    "async_rl": True,
    "batch_size": 1024,
}


class _Defaults:
    """Catches what a Sample Factory ``*_override_defaults(env, parser)`` sets."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def set_defaults(self, **values: Any) -> None:
        self.values.update(values)


def published_settings(settings: str) -> dict[str, Any]:
    """The settings as the installed Sample Factory's example file sets them (and the docs' extra)."""
    caught = _Defaults()
    if settings == "mujoco":
        from sf_examples.mujoco.mujoco_params import mujoco_override_defaults

        mujoco_override_defaults(None, caught)
    else:
        from sf_examples.atari.atari_params import atari_override_defaults

        atari_override_defaults(None, caught)
        if settings == "atari_faster":
            caught.values.update(ATARI_FASTER)
    return caught.values


def fit_to_workers(settings: dict[str, Any], workers: int) -> dict[str, Any]:
    """The settings for ``workers`` workers. Synchronous settings (``async_rl=False``) train each
    iteration on what one rollout of every worker collected, and Sample Factory refuses to start
    unless the samples of an iteration (``batch_size x num_batches_per_epoch``) are a whole
    multiple of a rollout's (``workers x num_envs_per_worker x rollout``): the published files are
    sized for 8 workers. With more, the iteration takes as many more minibatches of the same size
    as that needs (the epochs, the minibatch and the rollout stay); asynchronous settings are kept."""
    if settings.get("async_rl", True):
        return settings
    rollout = workers * settings.get("num_envs_per_worker", 2) * settings.get("rollout", 32)
    batch = settings.get("batch_size", 1024)
    batches = settings.get("num_batches_per_epoch", 1)
    while (batch * batches) % rollout:
        batches += 1
    return {**settings, "num_batches_per_epoch": batches}


def make_gym_env(full_env_name, cfg=None, env_config=None, render_mode=None):
    """A gymnasium id made as ``sf_examples/mujoco/mujoco_utils.make_mujoco_env`` makes its ids,
    in gymnasium's ``RecordEpisodeStatistics`` (which changes no observation or reward), as
    ``atari_utils.make_atari_env`` does: Sample Factory's own episode sums start over after its
    start-up's decorrelation steps, so each env's first episode would count from the middle."""
    import gymnasium as gym

    return gym.wrappers.RecordEpisodeStatistics(gym.make(full_env_name, render_mode=render_mode))


def make_atari_env(full_env_name, cfg=None, env_config=None, render_mode=None):
    """``sf_examples/atari/atari_utils.make_atari_env``, its ids registered first (gymnasium 1)."""
    from sf_examples.atari.atari_utils import make_atari_env as sf_make_atari_env

    sf_compat.register_atari()
    return sf_make_atari_env(full_env_name, cfg, env_config, render_mode)


def parse_config(args: argparse.Namespace, settings: dict[str, Any], train_dir: Path):
    """Sample Factory's full config: its defaults, the settings, then the machine's size and the
    run's bookkeeping (seed, device, where it writes) on its command line."""
    from sample_factory.cfg.arguments import parse_full_cfg, parse_sf_args

    argv = [
        "--algo=APPO",
        f"--env={args.env}",
        f"--experiment={args.env}_seed{args.seed}",
        f"--train_dir={train_dir}",
        "--restart_behavior=overwrite",
        f"--seed={args.seed}",
        f"--num_workers={args.workers}",
        f"--device={args.device}",
    ]
    parser, _ = parse_sf_args(argv=argv)
    parser.set_defaults(**settings)
    return parse_full_cfg(parser, argv)


class StopAtTarget:
    """Sample Factory's ``AlgoObserver`` and episodic-stats handler in one: feeds the tracker each
    finished episode, and ends the run once the target, the step budget or the time cap is met."""

    def __init__(self, tracker: TimeToTarget, max_env_steps: int, extra: dict[str, Any]):
        self.tracker, self.max_env_steps, self.extra = tracker, max_env_steps, extra
        self.stopping = False
        self.steps_per_sf_step = 1  # Sample Factory's steps (frames where it counts frames) per env step
        self.frames_per_env_step = 1

    def env_steps(self, runner) -> int:
        return runner.env_steps.get(0, 0) // self.steps_per_sf_step

    def episodes(self, runner, msg: dict, policy_id: int) -> None:
        import numpy as np

        stats = msg["episodic"]
        key = "RecordEpisodeStatistics_reward" if "RecordEpisodeStatistics_reward" in stats else "reward"
        for value in np.atleast_1d(stats[key]):
            self.tracker.episode(float(value), self.env_steps(runner))

    # the AlgoObserver interface (duck-typed: Runner calls these by name)
    def on_init(self, runner) -> None:
        self.frames_per_env_step = runner.env_info.frameskip
        if runner.cfg.summaries_use_frameskip:
            self.steps_per_sf_step = self.frames_per_env_step

    def on_connect_components(self, runner) -> None: ...

    def on_start(self, runner) -> None: ...

    def on_training_step(self, runner, training_iteration_since_resume: int) -> None:
        t = self.tracker
        if not self.stopping and (t.reached or t.out_of_time() or self.env_steps(runner) >= self.max_env_steps):
            self.stopping = True
            # Runner._should_end_training runs right after the observers: a budget of no steps
            # ends the run through Sample Factory's own stop (final checkpoint, workers joined)
            runner.cfg.train_for_env_steps = 0
            # the record now too: should the shutdown hang and the race kill it, this one stands
            print_record(self.record(runner, status="stopping"))

    def record(self, runner, status: int | str) -> dict[str, Any]:
        return self.tracker.record(
            self.env_steps(runner),
            system="sample-factory APPO",
            status=status,
            sf_env_steps=runner.env_steps.get(0, 0),
            sf_env_steps_per_env_step=self.steps_per_sf_step,
            frames_per_env_step=self.frames_per_env_step,
            **self.extra,
        )

    def extra_summaries(self, runner, policy_id, env_steps, writer) -> None: ...

    def on_stop(self, runner) -> None: ...


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="atari_pong", help="a Sample Factory Atari name (atari_pong) or a gymnasium id")
    p.add_argument("--settings", choices=sorted(SETTINGS_FILES), help="default: atari for atari_*, else mujoco")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target", type=float, default=None, help="stop at this 100-episode mean (default: none)")
    p.add_argument("--max-seconds", type=float, default=600.0)
    p.add_argument("--max-env-steps", type=int, default=10**12, help="env steps as tianji-dask counts them")
    p.add_argument("--workers", type=int, default=os.cpu_count(), help="num_workers (default: the cores)")
    p.add_argument("--device", choices=["gpu", "cpu"], help="the learner's (default: gpu where CUDA is)")
    p.add_argument("--train-dir", type=Path, help="Sample Factory's train_dir (default: a temporary folder)")
    args = p.parse_args(argv)
    atari = args.env.startswith("atari_")
    settings_name = args.settings or ("atari" if atari else "mujoco")
    if atari != settings_name.startswith("atari"):
        p.error(f"--settings {settings_name} is for {'other' if atari else 'Atari'} envs, not --env {args.env}")
    if args.workers < 1:
        p.error(f"--workers {args.workers}: give at least 1")
    import torch
    from sample_factory.envs.env_utils import register_env
    from sample_factory.train import make_runner

    if args.device is None:
        args.device = "gpu" if torch.cuda.is_available() else "cpu"
    if atari:
        from sf_examples.atari.atari_utils import ATARI_ENVS

        if args.env not in {spec.name for spec in ATARI_ENVS}:
            p.error(f"--env {args.env}: not one of Sample Factory's Atari names (atari_pong, atari_breakout, ...)")
    register_env(args.env, make_atari_env if atari else make_gym_env)
    settings = fit_to_workers(published_settings(settings_name), args.workers)
    train_dir = args.train_dir or Path(tempfile.mkdtemp(prefix="sf-appo-"))

    cfg = parse_config(args, settings, train_dir)
    try:  # one env made here, so that a missing package stops the run now (Sample Factory's own check can hang)
        (make_atari_env if atari else make_gym_env)(args.env, cfg).close()
    except Exception as exc:  # noqa: BLE001 - any failure to make the env is the user's to fix
        p.exit(2, f"{p.prog}: error: --env {args.env}: the env cannot be made here ({exc!r})\n")

    tracker = TimeToTarget(time.perf_counter(), args.target, args.max_seconds)
    cfg, runner = make_runner(cfg)
    extra = {
        "settings_name": settings_name,
        "settings_source": f"{SOURCE}: {SETTINGS_FILES[settings_name]}",
        "settings": {**settings, "num_workers": args.workers, "device": args.device, "seed": args.seed},
        "compat_patches": PATCHES,
        "torch_threads": torch.get_num_threads(),
    }
    stop = StopAtTarget(tracker, args.max_env_steps, extra)
    runner.register_episodic_stats_handler(stop.episodes)
    runner.register_observer(stop)
    status = runner.init()
    if status == 0:
        status = runner.run()
    print_record(stop.record(runner, int(status)))
    return 0 if status == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
