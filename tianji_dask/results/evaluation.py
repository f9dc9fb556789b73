"""Evaluating a trained run: its learner checkpoint's policy played for whole episodes
(``tianji-dask eval RUN_DIR``, :func:`evaluate`).

The policy acts without its exploration (:meth:`AlgorithmSpec.evaluation_policy`: greedy DQN
keeping ``epsilon`` of random actions, 0.001 by default as Atari evaluations do; PPO's most likely
action, or its mean for continuous actions) on ``envs`` parallel envs of the run's env. Returns are
the env's own: full Atari games, no reward clipping, no episode ended at a lost life. Each env
plays its share of the episodes, so short episodes are not over-counted. ``eval.nc`` holds one row
per episode (return, length, the env that played it) and, as attributes, the checkpoint's updates
and env steps. ``video`` plays one more episode in an env that renders its screen and writes one
frame per step to an MP4 file (imageio's ffmpeg; a GIF would merge identical frames, so it is not
offered).

Both files go into the run directory: ``eval.nc`` and ``eval.mp4`` by default, a relative ``out``
or ``video`` relative to it, an absolute one as given. Nothing is overwritten: where the file
exists, the next free name is taken (``eval-2.nc``, ``eval-3.nc``...; ``best.nc`` ->
``best-2.nc``), claimed when it is written so that two evaluations at once never share one.

A run that evaluated itself while it trained (``run.eval_every_env_steps``) keeps the policy of its
best evaluation in ``checkpoint_best``; :func:`evaluate` plays that one where it exists (``which``
picks), and :func:`play_state` is what both play.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import importlib.util
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tianji_dask.config import ConfigError, ExperimentConfig, load_config
from tianji_dask.results.atomic import atomic_write
from tianji_dask.results.rundir import run_dir_problem

EVAL_FILE = "eval.nc"
VIDEO_FPS = 30
# Rendering an env's screen into an array needs no window or sound: SDL's dummy drivers, so that
# pygame neither looks for a display (a warning without one) nor opens an audio device.
HEADLESS_SDL = {"SDL_VIDEODRIVER": "dummy", "SDL_AUDIODRIVER": "dummy"}
CHECKPOINTS = {"latest": "checkpoint", "best": "checkpoint_best"}  # which -> directory in the run's


@dataclass
class Evaluation:
    """What :func:`evaluate` measured; ``path`` is the ``eval.nc`` it wrote, ``video`` the MP4
    file (None without one)."""

    returns: np.ndarray
    lengths: np.ndarray
    updates: int
    env_steps: int
    path: Path
    checkpoint: str = "checkpoint"  # the run directory's checkpoint that was played
    video_frames: int = 0
    video: Path | None = None

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


@dataclass
class TrainedState:
    """A run's config and the learner state of one of its checkpoints, as :func:`load_trained` read them."""

    cfg: ExperimentConfig
    state: dict
    meta: dict
    checkpoint: str  # the run directory's checkpoint: "checkpoint" or "checkpoint_best"


def load_trained(run_dir: Path, which: str | None, device: str) -> TrainedState:
    """The config and checkpoint of ``run_dir`` that :func:`evaluate` and
    :func:`~tianji_dask.results.policy.load_policy` play: ``which`` ``"best"``
    (``checkpoint_best``), ``"latest"`` (``checkpoint``), or None: the best where the run kept one,
    else the latest; the policy to run on ``device``. A :class:`ConfigError` names what is wrong
    with the directory, its config or its checkpoint, and the fix."""
    if problem := run_dir_problem(run_dir):
        raise _refuse(run_dir, problem)
    if which is None:
        which = "best" if (run_dir / CHECKPOINTS["best"]).is_dir() else "latest"
    if which not in CHECKPOINTS:
        raise _refuse(run_dir, f"which={which!r}: one of {', '.join(CHECKPOINTS)}")
    cfg = load_config(run_dir / "config.yaml", [f"actor.device={device}"])

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
    return TrainedState(cfg, state, meta, name)


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
    ``out`` (default ``eval.nc``) and return what was measured. ``which``: ``"best"``
    (``checkpoint_best``, the best policy evaluated while the run trained), ``"latest"``
    (``checkpoint``), or None: the best where the run has one, else the latest. ``video``: an
    ``.mp4`` file to record one more episode into (``"eval.mp4"``, say). A relative ``out`` or
    ``video`` is relative to ``run_dir``; a file that exists is never overwritten, the next free
    name is written instead (``eval-2.nc``; the returned :class:`Evaluation` says which). Every
    problem with the input (the directory, its config or checkpoint, the video) is a
    :class:`ConfigError` before an env is built. ``on_episode(k, return, length)`` is called as
    episode k (from 1) ends."""
    run_dir = Path(run_dir)
    if episodes < 1:
        raise _refuse(run_dir, f"episodes={episodes}: play at least one")
    if not 0.0 <= epsilon <= 1.0:
        raise _refuse(run_dir, f"epsilon={epsilon}: a probability, in [0, 1]")
    trained = load_trained(run_dir, which, device)
    path = _output(run_dir, out if out is not None else EVAL_FILE, "--out")
    video_path = None if video is None else _output(run_dir, video, "--video")
    if video_path is not None:
        _check_video(run_dir, video_path, trained.cfg)
    cfg, meta = trained.cfg, trained.meta
    act, returns, lengths, played_by = play_state(
        cfg, trained.state, episodes, envs=envs, epsilon=epsilon, seed=seed, on_episode=on_episode
    )
    result = Evaluation(
        returns, lengths, int(meta.get("updates", 0)), int(meta.get("env_steps", 0)), path, trained.checkpoint
    )
    if video_path is not None:
        frames = _video_frames(cfg, act, seed)
        result.video = _write_video(frames, video_path)
        result.video_frames = len(frames)
    result.path = _write(result, played_by, cfg, run_dir, epsilon=epsilon, seed=seed)
    return result


def trained_policy(
    cfg, state: dict, observation_space, action_space, *, epsilon: float, seed: int, sample: bool = False
) -> Callable[[np.ndarray], np.ndarray]:
    """The policy of a learner's ``state`` of a run of ``cfg`` on ``cfg.actor.device``, for
    observations as the env gives them, batched: without exploration (DQN keeps ``epsilon`` of
    random actions; PPO's most likely action, or its mean) or, ``sample``, PPO's actions drawn
    from the policy (:meth:`AlgorithmSpec.evaluation_policy`)."""
    from tianji_dask.algos.registry import spec_for

    obs_dim = int(np.prod(observation_space.shape))
    return spec_for(cfg).evaluation_policy(cfg, state, action_space, obs_dim, epsilon=epsilon, seed=seed, sample=sample)


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
    n_envs = min(episodes, envs or min(episodes, cfg.env.num_envs, 16))
    env = _env(cfg, n_envs)
    try:
        act = trained_policy(
            cfg, state, env.single_observation_space, env.single_action_space, epsilon=epsilon, seed=seed
        )
        returns, lengths, played_by = _play(env, act, episodes, seed, _obs_dtype(cfg), on_episode)
    finally:
        env.close()
    return act, returns, lengths, played_by


def _output(run_dir: Path, given: str | Path, flag: str) -> Path:
    """Where an output named ``given`` goes: relative to the run directory, or absolute as given."""
    path = run_dir / Path(given).expanduser()
    if path.is_dir():
        raise _refuse(run_dir, f"{flag} {given}: {path} is a directory; name a file")
    return path


def _claim(path: Path) -> Path:
    """``path``, or the first of ``<stem>-2<suffix>``, ``-3``... that does not exist, created empty
    and exclusively: what is then written over it replaces nothing but this claim."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for i in range(1, 10_000):
        candidate = path if i == 1 else path.with_name(f"{path.stem}-{i}{path.suffix}")
        try:
            candidate.touch(exist_ok=False)
        except FileExistsError:
            continue
        return candidate
    raise FileExistsError(f"{path.parent} already holds 10000 files named {path.stem}-N{path.suffix}")


@contextlib.contextmanager
def _claimed(path: Path) -> Iterator[Path]:
    """:func:`_claim`'s name for a write; the claim is removed if the write fails."""
    claimed = _claim(path)
    try:
        yield claimed
    except BaseException:
        claimed.unlink(missing_ok=True)
        raise


def _check_video(run_dir: Path, video: Path, cfg) -> None:
    """The video's file name and the packages that render and encode it, before anything plays."""
    if video.suffix != ".mp4":
        raise _refuse(run_dir, f"--video {video}: name an .mp4 file")
    needed = ["imageio", "imageio_ffmpeg"]
    needed += ["cv2"] if getattr(cfg.env, "kind", "gym") == "atari" else ["pygame"]
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:
        raise _refuse(
            run_dir,
            f"--video needs {', '.join(missing)}, not installed: pip install 'tianji-dask[video]'",
        )


@contextlib.contextmanager
def _headless_sdl() -> Iterator[None]:
    """:data:`HEADLESS_SDL` for what runs inside, unless the user set them; then as before."""
    unset = [name for name in HEADLESS_SDL if name not in os.environ]
    os.environ.update({name: HEADLESS_SDL[name] for name in unset})
    try:
        yield
    finally:
        for name in unset:
            os.environ.pop(name, None)


def _video_frames(cfg, act, seed: int) -> list[np.ndarray]:
    """One episode in an env that renders its screen: one RGB frame per step."""
    from tianji_dask.envs import rendering_env

    with _headless_sdl():
        env = rendering_env(cfg.env)
        try:
            obs, _ = env.reset(seed=seed)
            frames, obs_dtype, ended = [], _obs_dtype(cfg), False
            while not ended:
                action = act(np.asarray(obs, obs_dtype)[None])[0]
                obs, _, terminated, truncated, _ = env.step(action)
                frames.append(_even_sized(env.render()))
                ended = terminated or truncated
        finally:
            env.close()
    return frames


def _even_sized(frame: np.ndarray) -> np.ndarray:
    """The frame with a copy of its last row or column added where its height or width is odd:
    H.264 in yuv420p, which every player reads, needs even sizes."""
    pad = [(0, frame.shape[0] % 2), (0, frame.shape[1] % 2), (0, 0)]
    return np.pad(frame, pad, mode="edge") if any(p[1] for p in pad) else frame


def _write_video(frames: list[Any], video: Path) -> Path:
    """``frames`` as an MP4 file at ``video`` or the next free name (:func:`_claim`), written
    beside and renamed into place; returns the file written."""
    import imageio.v2 as imageio

    with _claimed(video) as claimed, atomic_write(claimed, suffix=".mp4") as tmp:
        # macro_block_size 2: the even sizes H.264 needs (_even_sized), no resizing to 16s
        imageio.mimwrite(tmp, frames, fps=VIDEO_FPS, macro_block_size=2)
    return claimed


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


def _write(result: Evaluation, played_by: np.ndarray, cfg, run_dir: Path, *, epsilon: float, seed: int) -> Path:
    """``eval.nc`` at ``result.path`` or the next free name (:func:`_claim`), written beside and
    renamed into place so a crash leaves no half file; returns the file written."""
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
            "video": "" if result.video is None else str(result.video),
            "return_std": result.std,
        },
    )
    with _claimed(result.path) as path:
        write_netcdf_atomic(ds, path)
    return path
