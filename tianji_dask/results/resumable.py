"""Continuing a run in its own directory (``tianji-dask train --resume RUN_DIR``).

:func:`check_resumable` reads everything a continuation needs before anything starts: the run's
``config.yaml`` (with ``--set`` overrides of ``stop.*`` and ``run.*`` only: a new target or a
longer budget, never another experiment), its learner checkpoint, and its ``metrics.nc`` and
``episodes.nc``. A run that already met one of its stop rules (as ``--set`` leaves them) has
nothing left to run for and is refused too: continuing it needs a rule it has not reached. Any
problem is a :class:`~tianji_dask.config.ConfigError` naming the fix, and nothing in the
directory has been touched. The driver then builds the hosts with the learner restored and the
actors' env-step counts carried over, and its recorder extends the two files
(:meth:`~tianji_dask.results.recorder.MetricsRecorder.continue_from`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tianji_dask.config import ConfigError, load_config
from tianji_dask.config.loading import parse_override
from tianji_dask.config.schema import ExperimentConfig
from tianji_dask.results.rundir import run_dir_problem

RESUMABLE_SECTIONS = ("stop", "run")  # what --set may change when a run goes on


@dataclass
class ResumePoint:
    """What a continued run starts from."""

    run_dir: Path
    cfg: ExperimentConfig
    state: bytes  # the learner's, packed (:func:`~tianji_dask.results.checkpoint.pack_state`)
    meta: dict  # the checkpoint's metadata
    metrics: Any  # xarray.Dataset of metrics.nc, loaded
    episodes: Any  # xarray.Dataset of episodes.nc, loaded

    @property
    def run_name(self) -> str:
        """The run's name, as its files give it (the directory may have been given another)."""
        return str(self.metrics.attrs.get("run_name") or self.run_dir.name)

    def actor_env_steps(self) -> dict[int, int]:
        """Env steps each actor had made when the run stopped (its last metrics row)."""
        steps = self.metrics["actor_env_steps"]
        if steps.sizes["time"] == 0:
            return {}
        last = steps.isel(time=-1)
        return {int(a): int(v) for a, v in zip(last["actor"].values, last.values) if v == v}


def _refuse(run_dir: Path, problem: str) -> ConfigError:
    return ConfigError(f"--resume {run_dir}: {problem} (nothing in the directory was changed)")


def check_resumable(
    run_dir: str | Path, overrides: Sequence[str] = (), config: str | Path | None = None
) -> ResumePoint:
    """Everything :func:`~tianji_dask.runtime.driver.resume` needs from ``run_dir``, or a ConfigError.

    ``overrides``: ``--set`` texts, only of ``stop.*`` and ``run.*`` keys. ``config``: a config
    file given beside ``--resume``; it must describe the run's experiment (the same config up to
    ``stop`` and ``run``)."""
    run_dir = Path(run_dir)
    if problem := run_dir_problem(run_dir):
        raise _refuse(run_dir, problem)
    cfg = _run_config(run_dir, overrides, config)
    metrics, episodes = _run_results(run_dir)
    from tianji_dask.results.checkpoint import pack_state  # torch: after the cheap checks

    state, meta = _run_checkpoint(run_dir, cfg, metrics)
    # last: a run that could go on but has nothing left to run for
    reached = stop_rules_reached(cfg, metrics, episodes)
    if reached:
        raise _refuse(
            run_dir,
            f"the run already reached {_listed([what for what, _ in reached])}; "
            f"to continue it: {'; '.join(fix for _, fix in reached)}",
        )
    return ResumePoint(run_dir, cfg, pack_state(state), meta, metrics, episodes)


def _run_config(run_dir: Path, overrides: Sequence[str], config: str | Path | None) -> ExperimentConfig:
    """The run's own config with ``overrides`` (of the resumable sections only), which a
    ``config`` file given beside it must match."""
    saved = run_dir / "config.yaml"
    for text in overrides:
        keys, _ = parse_override(text)
        if keys[0] not in RESUMABLE_SECTIONS:
            raise _refuse(
                run_dir,
                f"--set {text} changes the experiment; a continued run keeps its config and may change "
                f"only {', '.join(s + '.*' for s in RESUMABLE_SECTIONS)} (e.g. --set stop.max_env_steps=...)",
            )
    cfg = load_config(saved, list(overrides))
    if config is not None:
        given = load_config(config, list(overrides))
        mismatch = _first_difference(cfg.model_dump(), given.model_dump())
        if mismatch:
            raise _refuse(
                run_dir,
                f"{config} is not the config of this run ({mismatch}); leave out the config file to continue "
                f"with the run's own {saved}",
            )
    return cfg


def _run_results(run_dir: Path) -> tuple[Any, Any]:
    """The run's ``metrics.nc`` and ``episodes.nc``, loaded, if a continued run can extend them."""
    import xarray as xr

    from tianji_dask.results.recorder import missing_variables

    files = {}
    for name in ("metrics.nc", "episodes.nc"):
        path = run_dir / name
        try:
            with xr.open_dataset(path, engine="netcdf4") as ds:
                files[name] = ds.load()
        except FileNotFoundError:
            raise _refuse(run_dir, f"{name} is missing; only a run that wrote its results can be continued") from None
        except Exception as exc:  # noqa: BLE001 - h5py/xarray raise many kinds for a damaged file
            raise _refuse(run_dir, f"{name} cannot be read ({type(exc).__name__}: {exc})") from None
    missing = missing_variables(files["metrics.nc"], files["episodes.nc"])
    if missing:
        raise _refuse(
            run_dir,
            f"its files lack {', '.join(missing[:4])}: written by an older tianji-dask, they cannot be extended",
        )
    if files["metrics.nc"].attrs.get("mode") != "distributed":
        raise _refuse(
            run_dir,
            f"the run was in mode {files['metrics.nc'].attrs.get('mode')!r}; --resume continues distributed runs "
            "(the serial reference is a measuring stick, run it again instead)",
        )
    return files["metrics.nc"], files["episodes.nc"]


def _run_checkpoint(run_dir: Path, cfg: ExperimentConfig, metrics: Any) -> tuple[dict, dict]:
    """The run's learner checkpoint (state, metadata), which a continued run starts from."""
    from tianji_dask.results.checkpoint import CheckpointError, load_run_checkpoint

    saved = run_dir / "config.yaml"
    try:
        return load_run_checkpoint(run_dir, cfg.algo.name, cfg.env.id)
    except CheckpointError as exc:
        if cfg.run.checkpoint and metrics.attrs.get("status") == "stopped" and not (run_dir / "checkpoint").exists():
            raise _refuse(
                run_dir,
                "it was stopped before its learner made an update, so it saved no checkpoint and has "
                f"nothing to continue; start it afresh: tianji-dask train {saved}",
            ) from None
        raise _refuse(run_dir, f"{exc}; a run continues from its learner checkpoint (run.checkpoint: true)") from None


def stop_rules_reached(cfg: ExperimentConfig, metrics: Any, episodes: Any) -> list[tuple[str, str]]:
    """The stop rules of ``cfg`` that the run of these files (``metrics.nc`` and ``episodes.nc``,
    loaded) already met, on the figures the run's own stop check reads (the mean of 100 episodes
    in the order they arrived, the env steps of all actors, the time axis), each as (what it
    reached, the ``--set`` that continues past it)."""
    stop, out = cfg.stop, []
    if stop.target_return is not None and (hit := _target_return_reached(episodes, stop.target_return)):
        mean, at, best = hit
        out.append(
            (
                f"stop.target_return={stop.target_return:g} (return(100) {mean:.1f} at {at:,} env steps)",
                f"--set stop.target_return=R with R above {best:.1f}, its best return(100), "
                "or --set stop.target_return=null with another stop rule",
            )
        )
    if stop.target_eval_return is not None and (hit := _target_eval_reached(metrics, stop.target_eval_return)):
        mean, at, best = hit
        out.append(
            (
                f"stop.target_eval_return={stop.target_eval_return:g} "
                f"(an evaluation's mean return {mean:.1f} at {at:,} env steps)",
                f"--set stop.target_eval_return=R with R above {best:.1f}, its best evaluation, "
                "or --set stop.target_eval_return=null with another stop rule",
            )
        )
    rows = metrics.sizes["time"]
    steps = int(metrics["env_steps"].values[-1]) if rows else 0
    if stop.max_env_steps is not None and steps >= stop.max_env_steps:
        out.append(
            (
                f"stop.max_env_steps={stop.max_env_steps} ({steps:,} env steps)",
                f"--set stop.max_env_steps={2 * steps} (any value above {steps:,})",
            )
        )
    # a continued run's clock starts where its last row left it: the budget counts the time before
    ran = float(metrics["time"].values[-1]) if rows else 0.0
    if stop.max_seconds is not None and ran >= stop.max_seconds:
        out.append(
            (
                f"stop.max_seconds={stop.max_seconds:g} ({ran:.1f} s, which a continued run counts on from)",
                f"--set stop.max_seconds={math.ceil(ran + stop.max_seconds)} "
                f"(another {stop.max_seconds:g} s; any value above {ran:.1f})",
            )
        )
    return out


def _target_return_reached(episodes: Any, target: float) -> tuple[float, int, float] | None:
    """The first mean of 100 consecutive episodes (in the order they arrived) at or above
    ``target``, the env steps when it was, and the highest such mean; None if none was."""
    returns = np.asarray(episodes["return"].values, dtype=float)
    if len(returns) < 100:
        return None
    means = np.lib.stride_tricks.sliding_window_view(returns, 100).mean(axis=1)
    hits = np.flatnonzero(means >= target)
    if not len(hits):
        return None
    first = int(hits[0])
    return float(means[first]), int(episodes["env_steps"].values[first + 99]), float(means.max())


def _target_eval_reached(metrics: Any, target: float) -> tuple[float, int, float] | None:
    """The first evaluation's mean return at or above ``target``, the env steps of the policy it
    played, and the best evaluation; None if none was."""
    if "eval_return_mean" not in metrics or not metrics.sizes.get("evaluation"):
        return None
    means = np.asarray(metrics["eval_return_mean"].values, dtype=float)
    hits = np.flatnonzero(means >= target)
    if not len(hits):
        return None
    first = int(hits[0])
    return float(means[first]), int(metrics["eval_env_steps"].values[first]), float(np.nanmax(means))


def _listed(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _first_difference(saved: dict, given: dict, prefix: str = "") -> str | None:
    """The first key (outside ``stop`` and ``run``) whose value differs, as ``key: a != b``."""
    for key in sorted(set(saved) | set(given), key=lambda k: (k not in ("name", "id"), k)):  # what it is, first
        if not prefix and key in RESUMABLE_SECTIONS:
            continue
        a, b = saved.get(key), given.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            found = _first_difference(a, b, f"{prefix}{key}.")
            if found:
                return found
        elif a != b:
            return f"{prefix}{key}: run {a!r}, file {b!r}"
    return None
