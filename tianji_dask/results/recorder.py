"""Run results: heartbeats in, xarray time series and per-episode records out, written as NetCDF.

Every host (actor, buffer, learner) sends the driver a heartbeat of *cumulative* counters about
twice a second. :class:`MetricsRecorder` keeps the latest heartbeat of each host (its ``tally``),
turns the counters into one time row per metrics interval (each variable by its function in
``metric_table``: rates from counter differences, sums over hosts, the 100-episode return window,
staleness, buffer fill) and builds ``metrics.nc`` / ``episodes.nc``. Every variable carries
``long_name`` and ``units`` so plots label themselves; ``docs/metrics.md`` defines each of them.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from tianji_dask.results.atomic import atomic_write
from tianji_dask.results.metric_table import ADDED_LATER, EPISODE_VARS, EVAL_VARS, HOST_KEYS, HOST_VARS, TIME_VARS
from tianji_dask.results.provenance import provenance_attrs
from tianji_dask.results.tally import Tally
from tianji_dask.roles.heartbeats import ROLES

RUNNING = "running"  # the status attr of the files a run writes before it has ended


class MetricsRecorder:
    """Turns heartbeats into time series.

    Call protocol: ``add(heartbeat)`` as they arrive (thread-safe), ``row(t_rel)`` every metrics
    interval, and ``dataset()`` / ``episodes_dataset()`` / ``write(run_dir)`` at any time, also
    while the run goes on. ``tally`` answers what the heartbeats said so far (env steps, the
    return window, the time to target, each host's totals).

    Rates (``*_fps``) are the difference of a host's cumulative counter between the heartbeat
    used by the previous row and the latest one, divided by the difference of the heartbeats' own
    ``t``. A host with no new heartbeat since the previous row keeps its previous rate; a host's
    first rate needs two heartbeats (NaN before). Sums over hosts skip hosts whose rate is NaN.
    Each row's variables are computed by the functions of ``metric_table.TIME_VARS``.
    """

    def __init__(
        self, *, run_name: str, target_return: float | None, config_json: str, t0: float, attrs: dict | None = None
    ):
        if not isinstance(config_json, str):
            raise TypeError(
                f"config_json must be a JSON string, got {type(config_json).__name__}; "
                "pass e.g. config.model_dump_json()"
            )
        try:
            json.loads(config_json)
        except ValueError as e:
            raise ValueError(f"config_json is not valid JSON ({e}); pass e.g. config.model_dump_json()") from e
        self.run_name = run_name
        self.target_return = None if target_return is None else float(target_return)
        self.config_json = config_json
        self.t0 = float(t0)
        self.tally = Tally(
            t0=self.t0,
            target_return=self.target_return,
            topology=json.loads(config_json).get("topology") or {},
        )
        self._extra_attrs = _netcdf_attrs(attrs or {})
        self._provenance = provenance_attrs()  # at start: the code this run was launched with
        self._lock = threading.Lock()
        self._rows: list[dict[str, Any]] = []
        self._host_rows: list[dict[tuple[str, int], tuple[float, ...]]] = []
        self._evaluations: list[dict[str, float]] = []  # EVAL_VARS of each evaluation, in order
        self._status, self._error = RUNNING, ""
        self._prior: xr.Dataset | None = None  # a continued run (continue_from): the previous run's rows

    def continue_from(self, metrics: xr.Dataset, episodes: xr.Dataset) -> None:
        """Carry on the run whose ``metrics.nc`` and ``episodes.nc`` these are (loaded): before
        any heartbeat, so that ``time`` continues from its last row, cumulative counters
        (``env_steps`` and each actor's, ``updates``, the loss counts...) from their last values,
        and the episodes (and the 100-episode window) from its episodes. :meth:`dataset` and
        :meth:`episodes_dataset` then hold the previous rows and episodes followed by the new."""
        missing = missing_variables(metrics, episodes)
        if missing:
            raise ValueError(f"cannot continue from files without {', '.join(missing)}")
        with self._lock:
            if self._rows:
                raise RuntimeError("continue_from must come before the first heartbeat and row")
            prior = metrics.copy()
            for k, v in ADDED_LATER.items():
                if k not in prior:
                    long_name, units, dtype, _ = TIME_VARS[k]
                    added = xr.full_like(prior["env_steps"], v, dtype=dtype)
                    prior[k] = added.assign_attrs(long_name=long_name, units=units)
            self.tally.carry_on(prior, episodes)
            self._prior = prior
            starts = json.loads(metrics.attrs.get("continued_at_s", "[]"))
            self._extra_attrs["continued_at_s"] = json.dumps([*starts, self.tally.time_offset])

    def add(self, heartbeat: dict) -> None:
        """Record one heartbeat: keep its counters as the host's latest, append its episodes.

        A heartbeat older than the latest one of the same host (out-of-order delivery) only
        contributes its episodes. Raises ValueError for a heartbeat without a known role.
        """
        self.tally.add(heartbeat)

    def record_losses(self, **counts: int) -> None:
        """Add to the driver's counts of re-created hosts and of what was lost with them
        (keys of ``LOSS_KEYS``); each row carries the running totals."""
        self.tally.record_losses(**counts)

    def row(self, t_rel: float | None = None) -> dict:
        """Append one time row from the latest counters and return it (scalars, for progress).

        ``t_rel`` is the row's time in seconds since ``t0``; default now.
        """
        if t_rel is None:
            t_rel = time.time() - self.t0
        with self._lock:
            r, per_host = self.tally.take_row(float(t_rel))
            self._rows.append(r)
            self._host_rows.append(per_host)
            return dict(r)

    def record_evaluation(self, *, mean: float, std: float, env_steps: int, t_rel: float) -> dict[str, float]:
        """One evaluation of the policy taken at ``env_steps`` and ``t_rel`` seconds since ``t0``
        (the variables of ``EVAL_VARS``, along the ``evaluation`` dimension of :meth:`dataset`);
        returns its record."""
        record = {
            "eval_return_mean": mean,
            "eval_return_std": std,
            "eval_env_steps": env_steps,
            "eval_time": t_rel + self.tally.time_offset,
        }
        with self._lock:
            self._evaluations.append(record)
        return dict(record)

    def best_evaluation(self) -> float:
        """The highest mean of this run's evaluations so far (:meth:`record_evaluation`); -inf before any."""
        with self._lock:
            return max((e["eval_return_mean"] for e in self._evaluations), default=-math.inf)

    def time_to_eval_return(self, target: float) -> float:
        """``eval_time`` of this run's first evaluation whose mean reached ``target``: when the
        policy that played it was taken. NaN if none did."""
        with self._lock:
            return next((e["eval_time"] for e in self._evaluations if e["eval_return_mean"] >= target), math.nan)

    # ---------------------------------------------------------------- datasets
    def set_outcome(self, status: str, error: str | None = None) -> None:
        """How the run ended, for the ``status`` and ``error`` attrs of every later dataset and
        write; before this call they are ``running`` and empty."""
        with self._lock:
            self._status, self._error = status, error or ""

    def set_attrs(self, attrs: dict[str, Any]) -> None:
        """Add or replace extra attrs of every later dataset and write (stored as
        ``MetricsRecorder(attrs=...)`` stores them)."""
        with self._lock:
            self._extra_attrs.update(_netcdf_attrs(attrs))

    def attrs(self) -> dict[str, Any]:
        """Dataset attrs: run name, target, time to target, config JSON, versions, git commit,
        the extra attrs, status and error."""
        a: dict[str, Any] = {
            "run_name": self.run_name,
            "target_return": math.nan if self.target_return is None else self.target_return,
            "time_to_target_s": float(self.tally.time_to_target_s),
            "config_json": self.config_json,
            "t0_unix": self.t0,
            **self._provenance,
            "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        }
        a.update(self._extra_attrs)
        a.update(status=self._status, error=self._error)
        return a

    def dataset(self) -> xr.Dataset:
        """Time series: dimension ``time`` (s since t0) plus ``actor``/``buffer``/``learner``."""
        with self._lock:
            rows = list(self._rows)
            host_rows = list(self._host_rows)
            evaluations = list(self._evaluations)
            attrs = self.attrs()
        n = len(rows)
        times = np.array([r["time"] for r in rows], dtype="float64")
        data_vars: dict[str, xr.Variable] = {}
        for name, (long_name, units, dtype, _) in TIME_VARS.items():
            data_vars[name] = xr.Variable(
                ("time",), np.array([r[name] for r in rows], dtype=dtype), {"long_name": long_name, "units": units}
            )
        ids = {role: sorted({hid for hr in host_rows for (r, hid) in hr if r == role}) for role in ROLES}
        for name, (role, long_name, units, source) in HOST_VARS.items():
            col = HOST_KEYS[role].index(source)
            arr = np.full((n, len(ids[role])), np.nan)
            index = {hid: j for j, hid in enumerate(ids[role])}
            for i, hr in enumerate(host_rows):
                for (r, hid), vals in hr.items():
                    if r == role:
                        arr[i, index[hid]] = vals[col]
            data_vars[name] = xr.Variable(("time", role), arr, {"long_name": long_name, "units": units})
        coords = {"time": ("time", times, {"long_name": "wall time since start", "units": "s"})}
        for role in ROLES:
            coords[role] = (role, np.array(ids[role], dtype="int64"), {"long_name": f"{role} host id", "units": "1"})
        ds = xr.Dataset(data_vars, coords=coords, attrs=attrs)
        if self._prior is None:
            return ds.merge(self._evaluations_dataset(evaluations))
        names = [*TIME_VARS, *HOST_VARS]
        both = xr.concat([self._prior[names], ds], dim="time", join="outer", combine_attrs="drop_conflicts")
        both.attrs = attrs
        for name in TIME_VARS:  # an outer join of host ids never touches these: keep their dtypes
            both[name] = both[name].astype(TIME_VARS[name].dtype)
        earlier = []  # files of a version before evaluations have none
        if all(k in self._prior for k in EVAL_VARS):
            columns = [self._prior[k].values for k in EVAL_VARS]
            earlier = [{k: v.item() for k, v in zip(EVAL_VARS, values)} for values in zip(*columns)]
        return both.merge(self._evaluations_dataset([*earlier, *evaluations]))

    @staticmethod
    def _evaluations_dataset(evaluations: list[dict[str, float]]) -> xr.Dataset:
        """EVAL_VARS along ``evaluation``, whose coordinate numbers them (so runs with different
        counts stack, as ``open_runs`` does)."""
        data_vars = {
            name: xr.Variable(
                ("evaluation",),
                np.array([e[name] for e in evaluations], dtype=dtype),
                {"long_name": long_name, "units": units},
            )
            for name, (long_name, units, dtype) in EVAL_VARS.items()
        }
        index = np.arange(len(evaluations), dtype="int64")
        return xr.Dataset(
            data_vars, coords={"evaluation": ("evaluation", index, {"long_name": "evaluation index", "units": "1"})}
        )

    def episodes_dataset(self) -> xr.Dataset:
        """Per-episode records in arrival order: dimension ``episode``."""
        with self._lock:
            cols = self.tally.episode_columns()
            attrs = self.attrs()
        n = len(cols["return"])
        data_vars = {
            name: xr.Variable(("episode",), np.array(cols[name], dtype=dtype), {"long_name": long_name, "units": units})
            for name, (long_name, units, dtype) in EPISODE_VARS.items()
        }
        coords = {
            "episode": (
                "episode",
                np.arange(n, dtype="int64"),
                {"long_name": "episode index (arrival order)", "units": "1"},
            )
        }
        return xr.Dataset(data_vars, coords=coords, attrs=attrs)

    def write(self, run_dir: Path) -> None:
        """Write ``run_dir/metrics.nc`` and ``run_dir/episodes.nc`` atomically, through h5netcdf (``_write_netcdf``).

        Both are written in full to temporary files before either is renamed over its old file,
        so a failure while writing them (a full disk) replaces neither.
        """
        run_dir = Path(run_dir)
        write_netcdf_files_atomic(
            {run_dir / "metrics.nc": self.dataset(), run_dir / "episodes.nc": self.episodes_dataset()}
        )


# ---------------------------------------------------------------------- helpers
def missing_variables(metrics: xr.Dataset, episodes: xr.Dataset) -> list[str]:
    """Variables a continued run needs that these files lack (files of an older version)."""
    needed = [k for k in [*TIME_VARS, *HOST_VARS] if k not in ADDED_LATER]
    return [f"metrics.nc:{k}" for k in needed if k not in metrics] + [
        f"episodes.nc:{k}" for k in EPISODE_VARS if k not in episodes
    ]


def _netcdf_attrs(attrs: dict) -> dict[str, Any]:
    """Make extra attrs storable in netCDF: drop None, dicts/lists of mixed values to JSON."""
    out: dict[str, Any] = {}
    for k, v in attrs.items():
        if v is None:
            continue
        if isinstance(v, bool):
            out[k] = int(v)
        elif isinstance(v, (str, int, float, np.integer, np.floating)):
            out[k] = v
        elif isinstance(v, (Path, _dt.datetime, _dt.date)):
            out[k] = v.isoformat() if not isinstance(v, Path) else str(v)
        elif isinstance(v, (dict, list, tuple)):
            try:
                out[k] = json.dumps(v)
            except TypeError as e:
                raise TypeError(f"attr {k!r}: {e}; pass JSON-serializable values") from e
        else:
            raise TypeError(
                f"attr {k!r} has type {type(v).__name__}, which netCDF cannot store; pass a str, number, dict or list"
            )
    return out


def write_netcdf_atomic(ds: xr.Dataset, path: Path) -> None:
    """Write one dataset to ``path`` atomically: a reader (or a crash) sees the old or the new file."""
    write_netcdf_files_atomic({Path(path): ds})


def _write_netcdf(ds: xr.Dataset, path: Path) -> None:
    """``ds.to_netcdf(path, engine="h5netcdf")`` without asking Dask for its scheduler. The data
    are numpy arrays, but ``to_netcdf`` picks its file lock by the process's Dask scheduler: with
    a user's default Client about (in a notebook), a distributed lock taken through that client
    (which fails once its scheduler is gone), and "no Client active" where a Client that failed or
    was closed left the setting behind. Changing the setting around the write is no way out:
    it is process-wide, and this runs in the run's thread beside the user's code.

    h5netcdf (h5py's HDF5) rather than netCDF4 (the netCDF-C library and its own HDF5): neither
    library is thread-safe, netCDF4 releases the GIL in its calls, and xarray holds its lock only
    while it opens a file, so a user's ``xr.open_dataset`` in another thread of the same process
    (a notebook's, while the run writes) crashed the process with a segmentation fault beside a
    netCDF4 write. h5py serialises its own calls, and its HDF5 is not netCDF4's. The files are
    the same netCDF-4 files; reading them stays with netCDF4, several times faster."""
    from xarray.backends import H5NetCDFStore
    from xarray.backends.locks import HDF5_LOCK

    store = H5NetCDFStore.open(path, mode="w", lock=HDF5_LOCK)
    try:
        ds.dump_to_store(store)
    finally:
        store.close()


def write_netcdf_files_atomic(datasets: dict[Path, xr.Dataset]) -> None:
    """Write every dataset to a temporary file, then rename each over its path: a failure while
    writing (a full disk) replaces none of them."""
    with ExitStack() as stack:
        # entered last first: they exit, and so rename, in the order given
        tmps = {path: stack.enter_context(atomic_write(path)) for path in reversed(list(datasets))}
        for path, ds in datasets.items():
            _write_netcdf(ds, tmps[path])
