"""The run's own checks, made before it starts anything, so that bad input is refused with the
fix and nothing started or written: its config read and checked (the deployment settings, the
schema, a continued run's directory: :mod:`~tianji_dask.results.resumable`), the devices where
its hosts run on this machine, then the env built once, the replay memories and a CUDA MPS daemon
where the run's own LocalCluster (or the serial reference) would run, and TensorBoard. Each
failure is a :class:`~tianji_dask.config.ConfigError`. The deployment's checks (the plan's fit,
the scheduler) are :mod:`tianji_dask.deploy.preflight`'s."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tianji_dask.config import ConfigError, ExperimentConfig, check_device, check_env, load_config
from tianji_dask.config.deployment import deployment_settings
from tianji_dask.config.machine import EnvSpaces
from tianji_dask.config.schema import DQNConfig
from tianji_dask.results.resumable import ResumePoint, check_resumable
from tianji_dask.results.tensorboard import check_tensorboard
from tianji_dask.runtime.processes.cuda_mps import mps_control


def run_config(
    config: str | Path | None, overrides: Sequence[str] = (), *, resume: str | Path | None = None
) -> tuple[ExperimentConfig, ResumePoint | None]:
    """The run's config, checked as far as it can be before it is known where the hosts run (the
    devices are not checked: a plan may set them), and, with ``resume``, what the continued run
    starts from. ``config``: the config file, or beside ``resume`` one that must describe the
    run's own experiment."""
    deployment_settings()  # a wrong tianji.* Dask setting: refused before any job or cluster starts
    if resume is not None:
        point = check_resumable(resume, overrides, config=config)
        return point.cfg, point
    assert config is not None, "a run without resume needs its config file"
    return load_config(config, list(overrides), check_device=False), None


def check_devices(cfg: ExperimentConfig, *, on_this_machine: bool) -> None:
    """The devices are checked where the hosts run: on this machine, not for Slurm's or a
    --scheduler's workers (a login node may have no GPU)."""
    if on_this_machine:
        check_device(cfg)


def check_before_start(cfg: ExperimentConfig, *, on_this_machine: bool, serial: bool) -> EnvSpaces:
    """What a run checks before it starts anything: the env (built once; its spaces are
    returned) and, where the run's replay memories live on this machine (its own LocalCluster,
    or serial), that they fit; for its own LocalCluster, that a CUDA MPS daemon the deployment
    settings require can start; that TensorBoard can be written if asked. Raises :class:`ConfigError`."""
    spaces = check_env(cfg)
    if cfg.run.tensorboard:
        check_tensorboard()
    if on_this_machine:
        check_replay_fits(cfg, spaces, serial=serial)
        if not serial:  # the run's own LocalCluster
            mps_control(deployment_settings().local_cluster.cuda_mps, cfg)
    return spaces


def check_replay_fits(cfg: ExperimentConfig, spaces: EnvSpaces, *, serial: bool, available: int | None = None) -> None:
    """Refuse, before anything starts, a run on this machine (its own LocalCluster, or serial)
    whose DQN replay memories would take more than 90 % of the memory available now."""
    import psutil

    from tianji_dask.algos.registry import spec_for

    replay_nbytes = spec_for(cfg).replay_nbytes
    obs = spaces.observation_space
    per_buffer = replay_nbytes(cfg, obs.shape, obs.dtype)
    if not per_buffer:
        return
    capacity = cfg.algo_as(DQNConfig).buffer_size  # only a replay algorithm keeps a replay
    buffers = 1 if serial else cfg.topology.groups * cfg.topology.learners
    if available is None:
        available = psutil.virtual_memory().available
    budget = 0.9 * available
    if per_buffer * buffers <= budget:
        return
    lo, hi = 0, capacity  # the largest size that fits (bytes grow with it)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if replay_nbytes(cfg, obs.shape, obs.dtype, capacity=mid) * buffers <= budget:
            lo = mid
        else:
            hi = mid - 1
    fits = lo
    gib = 2**30
    raise ConfigError(
        f"algo.buffer_size={capacity:,} needs {per_buffer / gib:.2f} GiB of replay per "
        f"buffer x {buffers} buffer(s) = {per_buffer * buffers / gib:.2f} GiB, more than 90 % of the "
        f"{available / gib:.2f} GiB this machine has available; lower algo.buffer_size to at most "
        f"{fits:,}, or train on a cluster with more memory (--scheduler, --slurm)"
    )
