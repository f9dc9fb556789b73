"""Evaluating a trained run: its learner checkpoint's policy played for whole episodes
(``tianji-dask eval RUN_DIR``, :func:`evaluate`).

The policy acts without its exploration (:meth:`AlgorithmSpec.evaluation_policy`: greedy DQN
keeping ``epsilon`` of random actions, 0.001 by default as Atari evaluations do; PPO's most likely
action, or its mean for continuous actions) on ``envs`` parallel envs of the run's env. Returns are
the env's own: full Atari games, no reward clipping, no episode ended at a lost life. Each env
plays its share of the episodes, so short episodes are not over-counted. ``eval.nc`` holds one row
per episode (return, length, the env that played it) and, as attributes, the checkpoint's updates
and env steps; it is never overwritten. ``video`` plays one more episode in an env that renders
its screen and writes one frame per step to an MP4 file (imageio's ffmpeg; a GIF would merge
identical frames, so it is not offered).

A run that evaluated itself while it trained (``run.eval_every_env_steps``) keeps the policy of its
best evaluation in ``checkpoint_best``; :func:`evaluate` plays that one where it exists (``which``
picks), and :func:`play_state` is what both play.
"""

from __future__ import annotations

import datetime as _dt
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tianji_dask.config import ConfigError, load_config
from tianji_dask.results.rundir import run_dir_problem

EVAL_FILE = "eval.nc"
VIDEO_FPS = 30
CHECKPOINTS = {"latest": "checkpoint", "best": "checkpoint_best"}  # which -> directory in the run's


@dataclass
class Evaluation:
    """What :func:`evaluate` measured; ``path`` is the ``eval.nc`` it wrote."""

    returns: np.ndarray
    lengths: np.ndarray
    updates: int
    env_steps: int
    path: Path
    checkpoint: str = "checkpoint"  # the run directory's checkpoint that was played
    video_frames: int = 0

    @property
    def mean(self) -> float:
        return float(self.returns.mean())

    @property
    def std(self) -> float:
        return float(self.returns.std())

    def summary(self) -> str:
        return (
            f"{len(self.returns)} episodes: return {self.mean:.1f} +- {self.std:.1f} "
            f"(min {self.returns.min():.1f}, max {self.returns.max():.1f}), mean length {self.lengths.mean():.0f}; "
            f"{self.checkpoint} at {self.updates:,} updates, {self.env_steps:,} env steps"
        )


def _refuse(run_dir: Path, problem: str) -> ConfigError:
    return ConfigError(f"eval {run_dir}: {problem}")


def evaluate(
    run_dir: str | Path,
    *,
    episodes: int = 20,
    envs: int | None = None,
    epsilon: float = 0.001,
    seed: int = 1_000_003,
    device: str = "cpu",
    out: str | Path | None = None,
    video: str | Path | None = None,
    which: str | None = None,
    on_episode: Callable[[int, float, int], None] = lambda k, ret, length: None,
) -> Evaluation:
    """Play ``episodes`` episodes with the policy of one of ``run_dir``'s checkpoints; write
    ``out`` (default ``run_dir/eval.nc``) and return what was measured. ``which``: ``"best"``
    (``checkpoint_best``, the best policy evaluated while the run trained), ``"latest"``
    (``checkpoint``), or None: the best where the run has one, else the latest. Every problem
    with the input (the directory, its config or checkpoint, an ``out`` that exists) is a
    :class:`ConfigError` before an env is built. ``on_episode(k, return, length)`` is called as
    episode k (from 1) ends."""
    run_dir = Path(run_dir)
    if which is None:
        which = "best" if (run_dir / CHECKPOINTS["best"]).is_dir() else "latest"
    if which not in CHECKPOINTS:
        raise _refuse(run_dir, f"which={which!r}: one of {', '.join(CHECKPOINTS)}")
    if episodes < 1:
        raise _refuse(run_dir, f"episodes={episodes}: play at least one")
    if not 0.0 <= epsilon <= 1.0:
        raise _refuse(run_dir, f"epsilon={epsilon}: a probability, in [0, 1]")
    if problem := run_dir_problem(run_dir):
        raise _refuse(run_dir, problem)
    path = Path(out) if out is not None else run_dir / EVAL_FILE
    if path.exists():
        raise _refuse(run_dir, f"{path} exists and is kept; give another file (--out) or remove it")
    cfg = load_config(run_dir / "config.yaml", [f"actor.device={device}"])
    if video is not None:
        _check_video(run_dir, Path(video), cfg)

    from tianji_dask.results.checkpoint import CheckpointError, load_run_checkpoint

    name = CHECKPOINTS[which]
    try:
        state, meta = load_run_checkpoint(run_dir, cfg.algo.name, cfg.env.id, name)
    except CheckpointError as exc:
        fix = (
            "a run keeps its best policy with run.eval_every_env_steps > 0"
            if which == "best"
            else "a run writes its checkpoint with run.checkpoint: true"
        )
        raise _refuse(run_dir, f"{exc}; {fix}") from None
    act, returns, lengths, played_by = play_state(
        cfg, state, episodes, envs=envs, epsilon=epsilon, seed=seed, on_episode=on_episode
    )
    result = Evaluation(returns, lengths, int(meta.get("updates", 0)), int(meta.get("env_steps", 0)), path, name)
    if video is not None:
        result.video_frames = _record_video(cfg, act, Path(video), seed)
    _write(result, played_by, cfg, run_dir, epsilon=epsilon, seed=seed)
    return result


def play_state(
    cfg,
    state: dict,
    episodes: int,
    *,
    envs: int | None = None,
    epsilon: float = 0.001,
    seed: int = 1_000_003,
    on_episode: Callable[[int, float, int], None] = lambda k, ret, length: None,
) -> tuple[Callable[[np.ndarray], np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
    """Play ``episodes`` episodes with the policy of a learner's ``state`` (tensors) of a run of
    ``cfg``, without exploration, on ``envs`` parallel envs (default: the config's, at most 16):
    (the policy, returns, lengths, the env of each episode)."""
    from tianji_dask.algos.registry import spec_for

    n_envs = min(episodes, envs or min(episodes, cfg.env.num_envs, 16))
    env = _env(cfg, n_envs)
    try:
        obs_dim = int(np.prod(env.single_observation_space.shape))
        act = spec_for(cfg).evaluation_policy(cfg, state, env.single_action_space, obs_dim, epsilon=epsilon, seed=seed)
        returns, lengths, played_by = _play(env, act, episodes, seed, _obs_dtype(cfg), on_episode)
    finally:
        env.close()
    return act, returns, lengths, played_by


def _check_video(run_dir: Path, video: Path, cfg) -> None:
    """The video's file and the packages that render and encode it, before anything plays."""
    if video.suffix != ".mp4":
        raise _refuse(run_dir, f"--video {video}: name an .mp4 file")
    if video.exists():
        raise _refuse(run_dir, f"--video {video} exists and is kept; give another file or remove it")
    needed = ["imageio", "imageio_ffmpeg"]
    needed += ["cv2"] if getattr(cfg.env, "kind", "gym") == "atari" else ["pygame"]
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:
        raise _refuse(
            run_dir,
            f"--video needs {', '.join(missing)}, not installed: pip install 'tianji-dask[video]'",
        )


def _record_video(cfg, act, video: Path, seed: int) -> int:
    """One episode in an env that renders its screen, one frame per step, written to ``video``;
    returns the frames written (the episode's steps)."""
    import imageio.v2 as imageio

    from tianji_dask.envs import rendering_env

    env = rendering_env(cfg.env)
    try:
        obs, _ = env.reset(seed=seed)
        frames, obs_dtype, ended = [], _obs_dtype(cfg), False
        while not ended:
            action = act(np.asarray(obs, obs_dtype)[None])[0]
            obs, _, terminated, truncated, _ = env.step(action)
            frames.append(env.render())
            ended = terminated or truncated
    finally:
        env.close()
    video.parent.mkdir(parents=True, exist_ok=True)
    imageio.mimwrite(video, frames, fps=VIDEO_FPS)
    return len(frames)


def _env(cfg, n_envs: int):
    from tianji_dask.envs import make_env

    return make_env(cfg.env.model_copy(update={"num_envs": n_envs, "async_batch": 0, "step_groups": 1}), 0)


def _obs_dtype(cfg) -> type:
    from tianji_dask.envs import observation_dtype

    return observation_dtype(cfg.env)


def _play(env, act, episodes: int, seed: int, obs_dtype, on_episode) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step every env until each has ended its share of ``episodes``: (returns, lengths, the env
    of each episode), in the order they ended."""
    n = env.num_envs
    share = np.array([episodes // n + (i < episodes % n) for i in range(n)])
    ended = np.zeros(n, np.int64)
    running_return, running_length = np.zeros(n), np.zeros(n, np.int64)
    returns: list[float] = []
    lengths: list[int] = []
    played_by: list[int] = []
    obs, _ = env.reset(seed=seed)
    while len(returns) < episodes:
        obs, rewards, terminated, truncated, _ = env.step(act(obs.astype(obs_dtype, copy=False)))
        running_return += rewards
        running_length += 1
        for i in np.flatnonzero(terminated | truncated):
            if ended[i] < share[i]:
                ended[i] += 1
                returns.append(float(running_return[i]))
                lengths.append(int(running_length[i]))
                played_by.append(int(i))
                on_episode(len(returns), returns[-1], lengths[-1])
            running_return[i], running_length[i] = 0.0, 0
    return np.asarray(returns), np.asarray(lengths), np.asarray(played_by)


def _write(result: Evaluation, played_by: np.ndarray, cfg, run_dir: Path, *, epsilon: float, seed: int) -> None:
    """``eval.nc``, written beside and renamed into place so a crash leaves no half file."""
    import xarray as xr

    from tianji_dask.results.recorder import write_netcdf_atomic

    ds = xr.Dataset(
        {
            "return": ("episode", result.returns),
            "length": ("episode", result.lengths),
            "env": ("episode", played_by),
        },
        coords={"episode": np.arange(1, len(result.returns) + 1)},
        attrs={
            "run_dir": str(run_dir),
            "algo": cfg.algo.name,
            "env_id": cfg.env.id,
            "checkpoint": result.checkpoint,
            "checkpoint_updates": result.updates,
            "checkpoint_env_steps": result.env_steps,
            "epsilon": epsilon,
            "seed": seed,
            "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "return_mean": result.mean,
            "video_frames": result.video_frames,
            "return_std": result.std,
        },
    )
    result.path.parent.mkdir(parents=True, exist_ok=True)
    write_netcdf_atomic(ds, result.path)
