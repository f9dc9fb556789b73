"""Continuing a run in its own directory (``tianji-dask train --resume RUN_DIR``).

:func:`check_resumable` reads everything a continuation needs before anything starts: the run's
``config.yaml`` (with ``--set`` overrides of ``stop.*`` and ``run.*`` only: a new target or a
longer budget, never another experiment), its learner checkpoint, and its ``metrics.nc`` and
``episodes.nc``. Any problem is a :class:`~tianji_dask.config.ConfigError` naming the fix, and
nothing in the directory has been touched. The driver then builds the hosts with the learner
restored and the actors' env-step counts carried over, and its recorder extends the two files
(:meth:`~tianji_dask.results.recorder.MetricsRecorder.continue_from`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    import xarray as xr

    from tianji_dask.results.recorder import missing_variables

    run_dir = Path(run_dir)
    if problem := run_dir_problem(run_dir):
        raise _refuse(run_dir, problem)
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
    from tianji_dask.results.checkpoint import (  # torch: after the cheap checks
        CheckpointError,
        load_run_checkpoint,
        pack_state,
    )

    try:
        state, meta = load_run_checkpoint(run_dir, cfg.algo.name, cfg.env.id)
    except CheckpointError as exc:
        metrics = files["metrics.nc"]
        if cfg.run.checkpoint and metrics.attrs.get("status") == "stopped" and not (run_dir / "checkpoint").exists():
            raise _refuse(
                run_dir,
                "it was stopped before its learner made an update, so it saved no checkpoint and has "
                f"nothing to continue; start it afresh: tianji-dask train {saved}",
            ) from None
        raise _refuse(run_dir, f"{exc}; a run continues from its learner checkpoint (run.checkpoint: true)") from None
    return ResumePoint(run_dir, cfg, pack_state(state), meta, files["metrics.nc"], files["episodes.nc"])


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
