"""Results analysis: run directories as xarray Datasets, many runs side by side, standard plots.

::

    from tianji_dask.results.analysis import open_run, open_runs
    ds = open_runs("runs/CartPole-v1__dqn__*")       # dims run, row, episode, actor, buffer, learner
    ds["seed"], ds["topology.actors"]               # config fields that differ: coords on run
    ds.tianji.time_to_target()                      # seconds per run, NaN if never reached
    ds.tianji.summary()                             # median and spread per config group
    ax = ds.tianji.plot_return(x="env_steps"); ax.figure.savefig("return.png")

One run (:func:`open_run`) is ``metrics.nc`` on its ``time`` dim merged with ``episodes.nc``,
whose variables get an ``episode_`` prefix (``episode_return``, ``episode_wall_time``...) because
``env_steps`` and ``actor`` exist in both files. Many runs (:func:`open_runs`) cannot share one
``time`` axis (each run has its own row times), so they are stacked on ``run`` x ``row`` (the
metrics row index) with ``time`` a (run, row) coordinate; shorter runs are NaN-padded.
docs/analysis.md describes the layout; docs/metrics.md defines every variable.
"""

from __future__ import annotations

import glob
import json
import math
import numbers
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

__all__ = ["RunNotFound", "TianjiAccessor", "flatten_config", "open_run", "open_runs"]

EPISODE_PREFIX = "episode_"
WINDOW = 100  # episodes in the return window of time to target (docs/metrics.md)
MAX_LABEL_SETTINGS = 4  # more differing settings than this: runs are labelled by their id
_SETTING_ATTRS = ("mode",)  # file attrs that describe how a run was made, like config fields
# config fields that say how a run is kept (run.*: its files, TensorBoard, checkpoints, restarts),
# not what it tries: runs that differ only in them are replicates. A stop rule stays a setting: a
# sweep over budgets or targets compares them.
NOT_SETTINGS = ("run.",)
_CONFIG_ATTRS = ("config_json", "env_id", "seed")  # file attrs that config coordinates stand for
# file attrs that are run coordinates even where all runs agree: runs are selected by them
_OUTCOME_ATTRS = {
    "status": "how the run ended (running while it goes on)",
    "error": "why the run failed (empty if it did not)",
}
UNKNOWN_STATUS = "unknown"  # the status of runs written before the files recorded it
# metrics.nc variables renamed since runs were first written: old name -> current name
RENAMED = {
    "buffer_size": "replay_size",
    "buffer_fill": "replay_fill",
    "sample_fps": "env_fps",
    "actor_sample_fps": "actor_env_fps",
}


class RunNotFound(FileNotFoundError):
    """A path is not a run directory, or a glob matched none."""


# ------------------------------------------------------------------------------ opening
def open_run(path: str | Path) -> xr.Dataset:
    """One run directory as a Dataset, loaded into memory (the files are closed again).

    Variables of ``metrics.nc`` on ``time`` (and ``actor``/``buffer``/``learner``), those of
    ``episodes.nc`` prefixed ``episode_`` on ``episode``. Attrs: the file's own (``run_name``,
    ``status``, ``error``, ``target_return``, ``time_to_target_s``, ``config_json``...), plus
    ``run_dir`` (absolute path) and ``config``: the resolved config flattened to dotted keys, as
    a JSON string (``ds.tianji.config`` parses it). Files from before the status was recorded
    get ``status="unknown"`` and ``error=""``; variables renamed since (:data:`RENAMED`) carry
    their current names.
    """
    run_dir = _check_run_dir(Path(path))
    ds = xr.load_dataset(run_dir / "metrics.nc", engine="netcdf4")
    ds = ds.rename({old: new for old, new in RENAMED.items() if old in ds.variables and new not in ds.variables})
    if (run_dir / "episodes.nc").exists():
        eps = xr.load_dataset(run_dir / "episodes.nc", engine="netcdf4")
        eps = eps.rename({v: EPISODE_PREFIX + str(v) for v in eps.data_vars})
        ds = ds.merge(eps, combine_attrs="override")  # same attrs in both files; metrics' win
    if "config_json" in ds.attrs:
        config = json.loads(ds.attrs["config_json"])
    else:
        import yaml

        config = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8")) or {}
    ds.attrs.setdefault("status", UNKNOWN_STATUS)
    ds.attrs.setdefault("error", "")
    ds.attrs["config"] = json.dumps(flatten_config(config))
    ds.attrs["run_dir"] = str(run_dir)
    return ds


def open_runs(paths: str | Path | Iterable[str | Path]) -> xr.Dataset:
    """Many run directories stacked on a new ``run`` dimension.

    ``paths``: a glob (``"runs/*dqn*"``), one directory, or a list of either. The ``run``
    coordinate holds the directory names (full paths if names repeat). Metrics lie on
    (``run``, ``row``) with ``time`` a (run, row) coordinate; episodes on (``run``, ``episode``);
    host ids and rows are outer-joined, so shorter runs and missing hosts are NaN.

    Every config field whose value differs between the runs becomes a coordinate on ``run``
    named by its dotted key (``seed``, ``topology.actors``), typed (None is NaN in a numeric
    field), with ``long_name`` from the config schema and ``source="config"``. Fields equal in all
    runs stay in ``attrs["config"]`` (JSON). File attrs follow the same rule: equal ones stay
    attrs, differing ones (``run_name``, ``time_to_target_s``, ``mode``...) become run coords;
    ``status`` and ``error`` are run coords always (``ds.sel(run=ds.status == "failed")``).
    """
    dirs = _expand(paths)
    runs = [open_run(d) for d in dirs]
    names = [d.name for d in dirs]
    ids = names if len(set(names)) == len(names) else [str(d) for d in dirs]

    stacked = [r.assign_coords(row=("time", np.arange(r.sizes["time"]))).swap_dims(time="row") for r in runs]
    ds = xr.concat(
        stacked, dim="run", data_vars="all", coords="all", join="outer", compat="equals", combine_attrs="override"
    ).drop_encoding()  # ints may hold NaN now
    ds["row"].attrs.update(long_name="metrics row index", units="1")
    ds = ds.assign_coords(run=("run", ids, {"long_name": "run directory"}))

    configs = [json.loads(r.attrs["config"]) for r in runs]
    same_config, diff_config = _split(configs)
    file_attrs = [{k: v for k, v in r.attrs.items() if k != "config"} for r in runs]
    same_attrs, diff_attrs = _split(file_attrs)
    same_attrs = {k: v for k, v in same_attrs.items() if k not in _OUTCOME_ATTRS}
    diff_attrs = [k for k in diff_attrs if k not in _CONFIG_ATTRS and k not in _OUTCOME_ATTRS]
    coords = {}
    for key in diff_config:
        coords[key] = (
            "run",
            _column([c.get(key) for c in configs]),
            {"long_name": _describe(key, configs) or key, "source": "config"},
        )
    for key in [*_OUTCOME_ATTRS, *diff_attrs]:
        if key not in coords:
            long_name = _OUTCOME_ATTRS.get(key, f"{key} (file attribute)")
            coords[key] = (
                "run",
                _column([a.get(key) for a in file_attrs]),
                {"long_name": long_name, "source": "file attribute"},
            )
    ds = ds.assign_coords(coords)
    ds.attrs = {**same_attrs, "config": json.dumps(same_config)}
    return ds


def flatten_config(config: dict, prefix: str = "") -> dict[str, Any]:
    """``{"topology": {"actors": 2}}`` -> ``{"topology.actors": 2}``; lists stay values."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(flatten_config(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _is_setting(key: str) -> bool:
    return not key.startswith(NOT_SETTINGS)


def _check_run_dir(path: Path) -> Path:
    fix = "pass a directory written by `tianji-dask train` (it holds config.yaml, metrics.nc, episodes.nc)"
    if not path.exists():
        raise RunNotFound(f"{path}: no such run directory; {fix}")
    if path.is_file():
        raise RunNotFound(f"{path} is a file, not a run directory; pass the directory that holds it ({path.parent})")
    if not (path / "metrics.nc").is_file():
        inner = sorted(p for p in path.iterdir() if (p / "metrics.nc").is_file())
        hint = (
            f"; it holds {len(inner)} run directories: open them all with open_runs('{path / '*'}')"
            if inner
            else f"; {fix}"
        )
        raise RunNotFound(f"{path} is not a tianji-dask run directory: it has no metrics.nc{hint}")
    return path.absolute()


def _expand(paths: str | Path | Iterable[str | Path]) -> list[Path]:
    items = [paths] if isinstance(paths, (str, Path)) else list(paths)
    if not items:
        raise RunNotFound("open_runs got no paths; pass a glob such as 'runs/*' or a list of run directories")
    dirs: list[Path] = []
    for item in items:
        if glob.has_magic(str(item)):
            matches = sorted(Path(m) for m in glob.glob(str(item)))
            # what else a glob meets (a sweep's sweep.yaml, runs/sweeps/) is not a run: left out
            found = [m for m in matches if (m / "metrics.nc").is_file()]
            if not found:
                what = f"matches {len(matches)} paths but no run directory" if matches else "matches nothing"
                raise RunNotFound(
                    f"the glob {str(item)!r} {what} (relative to {Path.cwd()}); "
                    "check the pattern, e.g. 'runs/CartPole-v1__dqn__*'"
                )
            dirs.extend(found)
        else:
            dirs.append(Path(item))
    return [_check_run_dir(d) for d in dirs]


def _plain(v: Any) -> Any:
    return v.tolist() if hasattr(v, "tolist") else v  # numpy scalars/arrays from netCDF attrs


def _key(v: Any) -> str:
    return json.dumps(_plain(v), sort_keys=True, default=str)  # NaN == NaN here


def _split(dicts: list[dict]) -> tuple[dict, list[str]]:
    """Keys whose values agree in every dict (with their value) and keys that differ."""
    keys = list(dict.fromkeys(k for d in dicts for k in d))
    missing = object()
    same, diff = {}, []
    for k in keys:
        values = [d.get(k, missing) for d in dicts]
        if any(v is missing for v in values) or len({_key(v) for v in values}) > 1:
            diff.append(k)
        else:
            same[k] = _plain(values[0])
    return same, diff


def _column(values: list) -> np.ndarray:
    """Typed values of one run coordinate: int, float (None -> NaN), bool, else strings."""
    values = [_plain(v) for v in values]
    if all(isinstance(v, (bool, np.bool_)) for v in values):
        return np.array(values, dtype=bool)
    numeric = [v for v in values if v is not None]
    if numeric and all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in numeric):
        if len(numeric) == len(values) and all(isinstance(v, numbers.Integral) for v in values):
            return np.array(values, dtype="int64")
        return np.array([math.nan if v is None else float(v) for v in values], dtype="float64")
    return np.array([v if isinstance(v, str) else json.dumps(v) for v in values], dtype=str)


def _describe(key: str, configs: list[dict]) -> str | None:
    """The config schema's description of a dotted field, if the schema knows it."""
    from tianji_dask.config.schema import ALGO_CONFIGS, ExperimentConfig

    algo: str = next((c["algo.name"] for c in configs if c.get("algo.name") in ALGO_CONFIGS), "")
    model: Any = ExperimentConfig
    parts = key.split(".")
    for i, part in enumerate(parts):
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return None
        if i == len(parts) - 1:
            return field.description
        model = ALGO_CONFIGS.get(algo) if part == "algo" else field.annotation
    return None


# ------------------------------------------------------------------------------ accessor
@xr.register_dataset_accessor("tianji")
class TianjiAccessor:
    """``ds.tianji``: time to target, a summary table and the standard plots, for a Dataset from
    :func:`open_run` (one run) or :func:`open_runs` (a ``run`` dimension: one line per run)."""

    def __init__(self, ds: xr.Dataset):
        self._ds = ds

    # --- metadata
    @property
    def config(self) -> dict[str, Any]:
        """Config fields as ``{dotted key: value}``; with a ``run`` dim only those all runs share."""
        return json.loads(self._ds.attrs.get("config", "{}"))

    @property
    def settings(self) -> list[str]:
        """Run coordinates that tell the runs apart: config fields (and ``mode``) whose values
        differ between the runs of this Dataset (a selection of runs may make some equal), but
        for ``run.*``, which says how a run is kept rather than what it tries (:data:`NOT_SETTINGS`)."""
        ds = self._ds
        return [
            str(c)
            for c, v in ds.coords.items()
            if v.dims == ("run",)
            and ((v.attrs.get("source") == "config" and _is_setting(str(c))) or c in _SETTING_ATTRS)
            and len({_key(x) for x in v.values}) > 1
        ]

    def labels(self, compact: bool = False) -> list[str]:
        """One label per run from its settings: ``"seed=1, topology.actors=2"``, or with
        ``compact`` only the values (``"1, 2"``; legends put the names in their title). The
        run ids when no setting differs or more than ``MAX_LABEL_SETTINGS`` do."""
        ds = self._ds
        if "run" not in ds.dims:
            return [str(ds.attrs.get("run_name", ds.coords["run"].item() if "run" in ds.coords else "run"))]
        settings = self._label_settings()
        if not settings:
            return [str(r) for r in ds["run"].values]
        return [
            ", ".join(_fmt(ds[s].values[i]) if compact else f"{s}={_fmt(ds[s].values[i])}" for s in settings)
            for i in range(ds.sizes["run"])
        ]

    def _label_settings(self) -> list[str]:
        settings = self.settings
        return settings if len(settings) <= MAX_LABEL_SETTINGS else []

    # --- numbers
    def time_to_target(self, target: float | None = None) -> xr.DataArray:
        """Seconds from start until the mean return of the last 100 episodes first reached ``target``.

        The same rule as the recorder's ``time_to_target_s`` (at least 100 episodes, taken at the
        finish time of the crossing episode), recomputed from the episodes so any target works.
        ``target=None`` uses each run's recorded ``target_return``. One value per run (dim
        ``run``) or a scalar; NaN where never reached or there is no target.
        """
        ds = self._ds
        if EPISODE_PREFIX + "return" not in ds:
            raise ValueError(
                "time_to_target needs the episodes (episode_return); this Dataset has none: "
                "open the run directory with open_run/open_runs, whose episodes.nc holds them"
            )
        if target is None:  # the recorded target: a run coordinate where it differs, else an attr
            target = ds.coords.get("target_return", ds.attrs.get("target_return", math.nan))
        returns, finished = ds[EPISODE_PREFIX + "return"], ds[EPISODE_PREFIX + "wall_time"]
        if ds.sizes.get("episode", 0) == 0:
            result = xr.full_like(returns.sum("episode"), math.nan, dtype=float)
        else:
            mean = returns.rolling(episode=WINDOW).construct("window").mean("window", skipna=False)
            reached = mean >= target
            first = reached.argmax("episode")
            result = finished.isel(episode=first).where(reached.any("episode")).drop_vars("episode")
        result = result.reset_coords(drop=True) if "run" not in result.dims else result
        result.name = "time_to_target_s"
        result.attrs = {
            "long_name": f"time until the mean return of the last {WINDOW} episodes reached the target",
            "units": "s",
        }
        return result

    def final_return(self) -> xr.DataArray:
        """The mean return of the last 100 episodes at each run's end (its last metrics row
        that has one): one value per run (dim ``run``) or a scalar; NaN for a run that finished
        no episode."""
        da = self._ds["return_mean_100"]
        da = da.transpose(..., "row" if "row" in da.dims else "time")
        values = np.asarray(da.values, dtype=float)
        rows = values.reshape(-1, values.shape[-1])
        last = [r[np.isfinite(r)][-1] if np.isfinite(r).any() else math.nan for r in rows]
        result = xr.DataArray(np.array(last).reshape(values.shape[:-1]), dims=da.dims[:-1])
        if "run" in result.dims:
            result = result.assign_coords(run=self._ds["run"].values)
        result.name = "final_return"
        result.attrs = {"long_name": f"mean return of the last {WINDOW} episodes at the run's end", "units": "1"}
        return result

    def summary(self, target: float | None = None) -> pd.DataFrame:
        """One row per settings group (all :attr:`settings` but ``seed``, which tells replicates
        apart): ``runs``, ``reached`` (the target) and, over the runs that reached it, the time
        to target's ``median_s``, ``q25_s``, ``q75_s``, ``min_s``, ``max_s``; then
        ``final_return``, the median over the group's runs of :meth:`final_return`, and
        ``status``, how its runs ended (``"2 target_reached, 1 stopped"``)."""
        ttt = self.time_to_target(target)
        final = self.final_return()
        if "run" not in ttt.dims:
            ttt, final = ttt.expand_dims("run"), final.expand_dims("run")
        status = self._ds["status"].values if "status" in self._ds.coords else [self._ds.attrs.get("status")]
        groups = [s for s in self.settings if s != "seed"]
        df = pd.DataFrame(
            {
                "time_to_target_s": ttt.values,
                "final_return": final.values,
                "status": np.asarray(status, dtype=str),
                **{g: self._ds[g].values for g in groups},
            }
        )
        by = groups or np.zeros(len(df), dtype=int)
        s = "time_to_target_s"
        table = df.groupby(by, dropna=False).agg(
            runs=(s, "size"),
            reached=(s, "count"),
            median_s=(s, "median"),
            q25_s=(s, lambda x: x.quantile(0.25)),
            q75_s=(s, lambda x: x.quantile(0.75)),
            min_s=(s, "min"),
            max_s=(s, "max"),
            final_return=("final_return", "median"),
            status=("status", _status_counts),
        )
        return table if groups else table.reset_index(drop=True)

    def replay_ratio(self, window_s: float = 10.0) -> xr.DataArray:
        """The replay ratio over consecutive windows of ``window_s`` seconds from each run's first
        learner update: samples consumed per transition received within the window, the figure
        the balance controller holds. The recorded ``replay_ratio`` is cumulative and counts the
        warm-up's transitions. Dim ``window`` (the window's start, seconds after the first
        update), and ``run`` for several runs; NaN where a window received nothing or a run
        ended sooner.

        Within a window, the learners' ``train_fps`` and the buffers' ``receive_fps`` are summed
        over its rows, each times its row's interval. These rates are measured over each host's
        own heartbeat times. The counters ``samples`` and ``received`` are not differenced: a
        row holds each host's latest heartbeat, and a host whose beat drifts past the rows' gives
        one row no growth, which would put a whole interval into another window."""
        ds = self._ds
        if not window_s > 0:
            raise ValueError(f"replay_ratio: window_s={window_s!r}; give a positive number of seconds")
        missing = [v for v in ("train_fps", "receive_fps", "updates") if v not in ds]
        if missing:
            raise ValueError(f"replay_ratio needs metrics.nc's {', '.join(missing)}")
        several = "run" in ds.dims
        one_by_one = [ds.isel(run=i) for i in range(ds.sizes["run"])] if several else [ds]
        per_run = [_windowed_ratio(one, window_s) for one in one_by_one]
        names = self.labels()
        empty = [
            f"{names[i]} ({_why_no_window(one, window_s)})"
            for i, (one, ratios) in enumerate(zip(one_by_one, per_run))
            if not np.isfinite(ratios).any()
        ]
        if empty:
            warnings.warn(
                f"replay_ratio(window_s={window_s:g}): no value for {'; '.join(empty)}; "
                "give a smaller window_s (or train longer)",
                RuntimeWarning,
                stacklevel=2,
            )
        values = np.full((len(per_run), max((len(r) for r in per_run), default=0)), np.nan)
        for i, ratios in enumerate(per_run):
            values[i, : len(ratios)] = ratios
        coords: dict[str, Any] = {"window": np.arange(values.shape[1]) * float(window_s)}
        attrs = {
            "long_name": f"samples consumed per transition received, {window_s:g}-s windows from the first update",
            "units": "1",
        }
        if several:
            coords["run"] = ds["run"].values
            return xr.DataArray(values, dims=("run", "window"), coords=coords, name="replay_ratio", attrs=attrs)
        return xr.DataArray(values[0], dims=("window",), coords=coords, name="replay_ratio", attrs=attrs)

    # --- plots
    def plot_return(self, x: str = "time", ax=None):
        """Mean return of the last 100 episodes against ``time`` or ``env_steps``; returns the Axes."""
        if x not in ("time", "env_steps"):
            raise ValueError(f"plot_return(x={x!r}): x must be 'time' or 'env_steps'")
        return self._plot("return_mean_100", x, ax, "return")

    @property
    def row_variables(self) -> list[str]:
        """The metrics.nc variables with one value per metrics row (``return_mean_100``,
        ``env_steps``, ``loss``...): what :meth:`plot_variable` draws."""
        rows = {"time", "row", "run"}
        return [str(v) for v, da in self._ds.data_vars.items() if set(da.dims) <= rows]

    def plot_variable(self, y: str, x: str = "time", ax=None):
        """Any of :attr:`row_variables` against ``time`` or another of them (``env_steps``,
        ``updates``): one line per run; returns the Axes."""
        for axis, name in (("y", y), ("x", x)):
            if name not in self.row_variables and not (axis == "x" and name == "time"):
                raise ValueError(
                    f"plot_variable({axis}={name!r}): not a metrics variable with one value per row; "
                    f"give one of {', '.join(self.row_variables)}" + (" or 'time'" if axis == "x" else "")
                )
        return self._plot(y, x, ax, y)

    def _plot(self, y: str, x: str, ax, title: str):
        ds = self._ds
        da = ds[y] if x == "time" else ds[y].assign_coords({x: ds[x]})
        return _finish(self._lines(da, x, _axes(ax)), self, title)

    def plot_throughput(self, ax=None):
        """Sample, receive and training throughput (env steps, transitions, samples per second)."""
        ax = _axes(ax)
        names = ("env_fps", "receive_fps", "train_fps")
        for i, name in enumerate(names):
            self._lines(self._ds[name], "time", ax, color=f"C{i}", what=name)
        ax.set_ylabel(f"throughput [{self._ds[names[0]].attrs.get('units', '')}]")
        return _finish(ax, self, "throughput", legend=True)

    def plot_staleness(self, ax=None):
        """Policy lag (parameter versions) and, where recorded (PPO), the mean sample age on a
        second y axis. Variables that are NaN throughout (e.g. PPO-only ones in DQN) are left out."""
        ax = _axes(ax)
        ds = self._ds
        lags = [v for v in ("policy_lag", "policy_lag_mean", "policy_lag_max") if _has_data(ds, v)]
        for i, name in enumerate(lags):
            self._lines(ds[name], "time", ax, color=f"C{i}", what=name)
        ax.set_ylabel(f"policy lag [{ds['policy_lag'].attrs.get('units', '')}]")
        ax.set_xlabel(_label(ds["time"]))
        if _has_data(ds, "sample_age_s"):
            twin = ax.twinx()
            self._lines(ds["sample_age_s"], "time", twin, color="C3", what="sample_age_s")
            twin.set_title("")  # xarray labelled the twin's y axis from long_name and units
            handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
            ax.legend(
                handles,
                [h.get_label() for h in handles],
                fontsize="small",
                title=_legend_title(self),
                title_fontsize="small",
            )
        if not lags and not _has_data(ds, "sample_age_s"):
            ax.text(0.5, 0.5, "no staleness recorded", transform=ax.transAxes, ha="center")
        return _finish(ax, self, "staleness", legend=not _has_data(ds, "sample_age_s"))

    def _lines(self, da: xr.DataArray, x: str, ax, *, what: str | None = None, **style):
        """One line per run (or one line) of ``da`` against ``x``; xarray labels the axes from
        ``long_name`` and ``units``. Several variables on one Axes (``what``: the variable's
        name, its legend entry) keep one colour per variable and get one line style per run."""
        multi = "run" in da.dims
        lines = da.plot.line(x=x, hue="run" if multi else None, ax=ax, add_legend=False, **style)
        labels = self.labels(compact=True)
        for i, line in enumerate(lines):
            if not multi:
                line.set_label(what or labels[0])
            elif what:
                line.set_label(f"{what}: {labels[i]}")
                line.set_linestyle(("-", "--", ":", "-.")[i % 4])
            else:
                line.set_label(labels[i])
            if np.isnan(np.asarray(line.get_ydata(), dtype=float)).all():
                line.set_label("_" + line.get_label())  # nothing drawn: keep it out of the legend
        return ax


def _status_counts(statuses: pd.Series) -> str:
    return ", ".join(f"{n} {status}" for status, n in sorted(statuses.value_counts().items()))


def _why_no_window(ds: xr.Dataset, window_s: float) -> str:
    """Why one run has no replay ratio in ``window_s`` windows: no update, too short, or its
    buffers received nothing."""
    t, updates = ds["time"].values.astype(float), ds["updates"].values.astype(float)
    keep = np.isfinite(t) & np.isfinite(updates)
    t, updates = t[keep], updates[keep]
    started = np.flatnonzero(updates > 0)
    if not len(started):
        return "its learner made no update"
    span = t[-1] - t[started[0]]
    if span < window_s:
        return f"it trained {span:.1f} s from its first update, less than one {window_s:g}-s window"
    return "its buffers received no transition in any window"


def _windowed_ratio(ds: xr.Dataset, window_s: float) -> np.ndarray:
    """One run's replay ratio per ``window_s`` window from its first update (rows a stacked
    Dataset pads with NaN dropped); empty before any update."""
    t, consumed, got, updates = (ds[v].values.astype(float) for v in ("time", "train_fps", "receive_fps", "updates"))
    keep = np.isfinite(t) & np.isfinite(updates)
    t, consumed, got, updates = t[keep], consumed[keep], got[keep], updates[keep]
    started = np.flatnonzero(updates > 0)
    if not len(started):
        return np.empty(0)
    first = started[0]
    # what a row's rates say was consumed and received since the row before
    interval = np.diff(t, prepend=t[0])
    consumed, got = np.nan_to_num(consumed) * interval, np.nan_to_num(got) * interval
    windows = int((t[-1] - t[first]) // window_s)
    which = np.floor((t - t[first]) / window_s - 1e-9).astype(int)  # a row closes the interval it ends
    inside = (np.arange(len(t)) > first) & (which < windows)
    consumed_w = np.bincount(which[inside], consumed[inside], minlength=windows)
    got_w = np.bincount(which[inside], got[inside], minlength=windows)
    return np.where(got_w > 0, consumed_w / np.where(got_w > 0, got_w, 1.0), np.nan)


def _axes(ax):
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(7, 4), layout="constrained")
    return ax


def _finish(ax, acc: TianjiAccessor, title: str, legend: bool | None = None):
    ax.set_title(title if "run" in acc._ds.dims else f"{title}: {acc.labels()[0]}", fontsize="medium")
    if (legend or (legend is None and "run" in acc._ds.dims)) and ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small", title=_legend_title(acc), title_fontsize="small")
    return ax


def _legend_title(acc: TianjiAccessor) -> str | None:
    return (", ".join(acc._label_settings()) or "run") if "run" in acc._ds.dims else None


def _has_data(ds: xr.Dataset, name: str) -> bool:
    return name in ds and bool(ds[name].notnull().any())


def _label(da: xr.DataArray) -> str:
    units = da.attrs.get("units")
    return da.attrs.get("long_name", str(da.name)) + (f" [{units}]" if units else "")


def _fmt(v: Any) -> str:
    v = _plain(v)
    return f"{v:g}" if isinstance(v, float) else str(v)
