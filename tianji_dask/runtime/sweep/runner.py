"""Many runs of one config at once: a grid of ``--set`` values, ``parallel`` runs at a time
(``tianji-dask sweep``, :func:`sweep`), and the runs an interrupted sweep left
(``tianji-dask sweep --resume DIR``, :func:`resume_sweep`).

Every combination of the grid's values (:mod:`~tianji_dask.runtime.sweep.grid`) is a run with its
own hosts and its own directory under the sweep's (``seed=0__algo.lr=0.0003``). All configs are
loaded and checked before the first run starts, so a bad key or value is refused with nothing
started or written. Without a client each run starts its own LocalCluster, as ``tianji-dask
train`` does; with one, the runs share that cluster's workers; with one client per slot
(``clients``, K of them: e.g. K planned Slurm allocations, ``deploy/slurm_sweep.py``), each run
goes to a slot no other run holds. A run that fails is recorded ``failed`` in its files and the
others go on. ``on_line`` gets a line as each run starts and ends, ``on_runs`` the runs with their
latest metrics rows every poll (a live view: ``tianji_dask.runtime.sweep.progress``).

As it starts, a sweep writes its manifest (``sweep.yaml``, :mod:`~tianji_dask.runtime.sweep.manifest`).
Ctrl-C stops the runs in progress (they end ``stopped``, results and checkpoint written) and
starts no more. :func:`resume_sweep` plans from the manifest: a finished run is left as it is; a
stopped or failed one (or one whose sweep was killed) is continued in its own directory from its
checkpoint, as ``tianji-dask train --resume`` continues a run, so that the time it trained counts;
one never started starts.
"""

from __future__ import annotations

import datetime as _dt
import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tianji_dask.config import ConfigError, ExperimentConfig, apply_overrides, check_device, check_env, validate_config
from tianji_dask.config.deployment import deployment_settings
from tianji_dask.config.loading import read_config_file
from tianji_dask.runtime.driver import FINISHED
from tianji_dask.runtime.sweep.grid import Axes, parse_grid, run_name
from tianji_dask.runtime.sweep.manifest import MANIFEST, Manifest, held, read_manifest, write_manifest

if TYPE_CHECKING:
    from tianji_dask.runtime.driver import Run

POLL_S = 0.2


@dataclass
class SweepRun:
    """One combination of the grid: its overrides, config and directory, and once started its
    :class:`~tianji_dask.runtime.driver.Run` handle and latest metrics ``row``. ``continues``:
    a resumed sweep continues the run its directory holds instead of starting one."""

    name: str
    overrides: list[str]
    cfg: ExperimentConfig
    run_dir: Path
    handle: Run | None = None
    status: str = "waiting"
    error: str | None = None
    slot: int | None = None  # which of the ``parallel`` places it runs in, once started
    continues: bool = False
    row: dict[str, Any] | None = None

    @property
    def finished(self) -> bool:
        return self.status in FINISHED


@dataclass
class Sweep:
    """A sweep's runs, in grid order, and what its manifest records."""

    out: Path
    runs: list[SweepRun] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)  # the config file's content
    config_path: str = ""
    axes: Axes = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)
    parallel: int = 1  # as the manifest records it

    @property
    def ok(self) -> bool:
        return all(r.finished for r in self.runs)

    @property
    def left(self) -> list[SweepRun]:
        """The runs not finished: never started, stopped or failed."""
        return [r for r in self.runs if not r.finished]

    def run(
        self,
        parallel: int = 1,
        client=None,
        on_line: Callable[[str], None] = print,
        *,
        clients: Sequence | None = None,
        on_runs: Callable[[list[SweepRun]], None] | None = None,
    ) -> Sweep:
        """Run those waiting, ``parallel`` at a time, and return when all have ended; each
        run's :attr:`SweepRun.handle` is set as it starts. Ctrl-C stops those running (results
        written) and raises KeyboardInterrupt, the others left waiting. ``clients``: one client
        per slot instead of ``client`` (``parallel`` of them), a run on each at a time."""
        if parallel < 1:
            raise ConfigError(f"parallel={parallel}: at least one run at a time")
        if clients is not None and (client is not None or len(clients) != parallel):
            raise ConfigError(f"clients: give one per slot ({parallel}, as parallel), and no client beside them")
        self.write_manifest(parallel)
        slots = list(clients) if clients is not None else [client] * parallel
        with held(self.out):
            _Runner(self, slots, on_line, on_runs or (lambda runs: None)).run()
        return self

    def write_manifest(self, parallel: int) -> None:
        """Create the sweep's directory and its ``sweep.yaml`` (a resumed sweep keeps its own)."""
        self.out.mkdir(parents=True, exist_ok=True)
        names = [r.name for r in self.runs]
        write_manifest(self.out, Manifest(self.config, self.config_path, self.axes, self.overrides, parallel, names))

    def open(self):
        """The runs that wrote results, stacked (:func:`~tianji_dask.results.analysis.open_runs`)."""
        from tianji_dask.results.analysis import open_runs

        return open_runs([r.run_dir for r in self.runs if (r.run_dir / "metrics.nc").exists()])


def _run_config(data: dict, sets: list[str], source: str) -> ExperimentConfig:
    """``load_config`` of the config file's content: overrides, schema, this machine."""
    cfg = validate_config(apply_overrides(data, sets), source=source + "".join(f" --set {o}" for o in sets))
    check_env(cfg)
    check_device(cfg)
    return cfg


def _runs(out: Path, data: dict, source: str, axes: Axes, overrides: Sequence[str]) -> list[SweepRun]:
    combinations = [
        [(key, v) for (key, _), v in zip(axes, values)] for values in itertools.product(*(vals for _, vals in axes))
    ]
    named: dict[str, list[tuple[str, str]]] = {}
    for combination in combinations:
        name = run_name(combination)
        twin = named.get(name.lower())
        if twin is not None:
            shown = [", ".join(f"{k}={v}" for k, v in c) for c in (twin, combination)]
            raise ConfigError(
                f"--grid: the runs {shown[0]} and {shown[1]} would share the directory {name}; "
                "give values that differ in more than brackets, quotes and punctuation"
            )
        named[name.lower()] = combination
    runs: list[SweepRun] = []
    for combination in combinations:
        sets = [*overrides, *(f"{k}={v}" for k, v in combination)]
        name = run_name(combination)
        try:
            cfg = _run_config(data, sets, source)
        except ConfigError as exc:
            raise ConfigError(f"sweep run {name}: {exc}") from None
        runs.append(SweepRun(name, sets, cfg, out / name))
    return runs


def plan_sweep(
    config: str | Path,
    grid: Sequence[str],
    overrides: Sequence[str] = (),
    out: str | Path | None = None,
    *,
    grid_file: str | Path | None = None,
) -> Sweep:
    """The sweep's runs, every config loaded and checked, the directory chosen: nothing written.
    ``grid``: ``--grid`` texts, ``grid_file`` a YAML grid (:mod:`~tianji_dask.runtime.sweep.grid`).
    ``out`` must be new or empty (default ``<runs-dir>/sweeps/<config>__<time>``)."""
    axes = parse_grid(grid, grid_file)
    if out is None:
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        out = deployment_settings().runs_dir / "sweeps" / f"{Path(config).stem}__{stamp}"
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        hint = " (to finish an interrupted sweep: --resume DIR)" if (out / MANIFEST).is_file() else ""
        raise ConfigError(f"sweep directory {out} exists and is not empty; give a new one (--out) or remove it{hint}")
    data = read_config_file(config)
    runs = _runs(out, data, str(config), axes, overrides)
    return Sweep(out, runs, data, str(Path(config).absolute()), axes, list(overrides))


def resume_sweep(out: str | Path) -> Sweep:
    """The sweep in ``out`` as its manifest planned it, each run's status read from its files:
    finished ones keep theirs (and are never touched), stopped and failed ones will continue
    from their checkpoints (``continues``), those never started, or stopped as they started
    (no update, no checkpoint), wait to start. Nothing written; a
    :class:`ConfigError` naming the fix for a directory that is not a sweep's, or a run that
    cannot go on."""
    from tianji_dask.results.resumable import check_resumable

    out = Path(out)
    manifest = read_manifest(out)
    with held(out):  # not while another process runs it
        pass
    runs = _runs(out, manifest.config, manifest.config_path, manifest.axes, manifest.overrides)
    if [r.name for r in runs] != manifest.runs:
        raise ConfigError(
            f"--resume {out}: its {MANIFEST} lists other runs than its grid makes (written by another "
            "tianji-dask version?); start a new sweep with --out"
        )
    for r in runs:
        status = _recorded_status(r.run_dir)
        if status is None:
            continue  # never started
        if status in FINISHED:
            r.status = status
            continue
        if status == "stopped" and _never_trained(r.run_dir):
            continue  # stopped as it started: nothing to continue, it starts again
        try:
            check_resumable(r.run_dir)
        except ConfigError as exc:
            raise ConfigError(
                f"--resume {out}: run {r.name} ended {status} and cannot be continued: {exc}; to run it again "
                f"from the start, move {r.run_dir} away and resume again"
            ) from None
        r.status, r.continues = status, True
    return Sweep(out, runs, manifest.config, manifest.config_path, manifest.axes, manifest.overrides, manifest.parallel)


UNTRAINED_FILES = ("config.yaml", "metrics.nc", "episodes.nc")  # all a run stopped as it started wrote


def _never_trained(run_dir: Path) -> bool:
    """A run stopped as it started: no checkpoint, and its learner made no update."""
    import xarray as xr

    if (run_dir / "checkpoint").exists() or not set(p.name for p in run_dir.iterdir()) <= set(UNTRAINED_FILES):
        return False
    with xr.open_dataset(run_dir / "metrics.nc", engine="netcdf4") as ds:
        return "updates" not in ds or ds.sizes.get("time", 0) == 0 or float(ds["updates"].max()) == 0


def _recorded_status(run_dir: Path) -> str | None:
    """How the run in ``run_dir`` ended by its files (``running`` for one whose sweep was
    killed); None where no run wrote results (no directory, or only the config of a run
    stopped as it started). A directory with other files but no results is refused."""
    if not run_dir.is_dir():
        return None
    entries = {p.name for p in run_dir.iterdir()}
    if not (run_dir / "metrics.nc").is_file():
        if entries <= {"config.yaml"}:
            return None
        raise ConfigError(
            f"--resume: {run_dir} holds {', '.join(sorted(entries))} but no results (metrics.nc); "
            "move it away to run it again from the start"
        )
    import xarray as xr

    try:
        with xr.open_dataset(run_dir / "metrics.nc", engine="netcdf4") as ds:
            return str(ds.attrs.get("status", "running"))
    except Exception as exc:  # noqa: BLE001 - h5py/xarray raise many kinds for a damaged file
        raise ConfigError(f"--resume: {run_dir}/metrics.nc cannot be read ({type(exc).__name__}: {exc})") from None


def sweep(
    config: str | Path,
    grid: Sequence[str],
    *,
    overrides: Sequence[str] = (),
    parallel: int = 1,
    out: str | Path | None = None,
    client=None,
    on_line: Callable[[str], None] = print,
    on_runs: Callable[[list[SweepRun]], None] | None = None,
    grid_file: str | Path | None = None,
) -> Sweep:
    """Run every combination of ``grid`` (``["seed=0,1,2", ...]``), ``parallel`` at a time:
    :func:`plan_sweep`, then :meth:`Sweep.run`. See the module's docstring."""
    if parallel < 1:
        raise ConfigError(f"parallel={parallel}: at least one run at a time")
    planned = plan_sweep(config, grid, overrides, out, grid_file=grid_file)
    return planned.run(parallel, client, on_line, on_runs=on_runs)


def _handle(r: SweepRun) -> Run:
    assert r.handle is not None, r.name
    return r.handle


class _Runner:
    def __init__(
        self,
        planned: Sweep,
        slots: list,
        on_line: Callable[[str], None],
        on_runs: Callable[[list[SweepRun]], None],
    ):
        self.planned, self.slots, self.on_line, self.on_runs = planned, slots, on_line, on_runs
        self.total = len(planned.runs)

    def run(self) -> None:
        waiting = [r for r in self.planned.runs if not r.finished]
        for r in waiting:
            r.status = "waiting"
        running: list[SweepRun] = []
        try:
            while waiting or running:
                while waiting and len(running) < len(self.slots):
                    held = {r.slot for r in running}
                    slot = next(k for k in range(len(self.slots)) if k not in held)
                    running.append(self._start(waiting.pop(0), slot))
                self.on_runs(self.planned.runs)
                time.sleep(POLL_S)
                for r in [r for r in running if r.handle is None or r.handle.done]:
                    running.remove(r)
                    self._ended(r)
        except KeyboardInterrupt:
            # every run with a handle whose end was not yet taken, even one the interrupt caught
            # between its start and the list above
            self._stop([r for r in self.planned.runs if r.handle is not None and r.status in ("waiting", "running")])
            raise

    def _stop(self, running: list[SweepRun]) -> None:
        """Stop the runs in progress and wait for their results; a second Ctrl-C, wherever it
        falls, hurries them (``Run.stop(now=True)``), a third leaves at once."""
        left = [r for r in running if r.handle is not None]
        asked = now = False
        while left:
            try:
                if not asked:
                    asked = True
                    self.on_line(
                        f"interrupted: stopping {len(left)} running run(s), their results written "
                        "(again to stop at once); no more runs start"
                    )
                    for r in left:
                        _handle(r).stop("stopped")
                self._ended(left[0])
                left.pop(0)
            except KeyboardInterrupt:
                if now:
                    raise
                now = True
                for r in left:
                    _handle(r).stop("stopped", now=True)

    def _label(self, r: SweepRun) -> str:
        return f"[{self.planned.runs.index(r) + 1}/{self.total}] {r.name}"

    def _start(self, r: SweepRun, slot: int) -> SweepRun:
        from tianji_dask.runtime.driver import resume, train

        r.slot, r.row, r.error, r.handle = slot, None, None, None

        def on_row(row: dict) -> None:
            r.row = row

        try:
            if r.continues:
                r.handle = resume(r.run_dir, self.slots[slot], on_row=on_row)
            else:
                if r.run_dir.is_dir() and (
                    not (r.run_dir / "metrics.nc").exists() or _never_trained(r.run_dir)
                ):  # a run stopped as it started: what it wrote is written again
                    for name in UNTRAINED_FILES:
                        (r.run_dir / name).unlink(missing_ok=True)
                r.handle = train(r.cfg, self.slots[slot], out=r.run_dir, on_row=on_row)
        except Exception as exc:  # noqa: BLE001 - a run that cannot start is recorded, the others go on
            r.status, r.error = "failed", f"{type(exc).__name__}: {exc}"
            return r
        r.status = "running"
        how = f"continued from {r.handle.recorder.tally.env_steps:,} env steps" if r.continues else "started"
        self.on_line(f"{self._label(r)}: {how} in {r.run_dir}")
        return r

    def _ended(self, r: SweepRun) -> None:
        if r.handle is not None:
            result = r.handle.wait()
            r.status, r.error, r.row = result.status, result.error, result.final_row
            ret = result.return_mean_100
            said = (
                f"{result.status} after {result.env_steps:,} env steps in {result.wall_s:.1f} s, "
                f"return(100) {'-' if math.isnan(ret) else f'{ret:.1f}'}"
            )
        else:
            said = "failed to start"
        if r.error:
            said += f": {r.error.strip().splitlines()[0]}"
        self.on_line(f"{self._label(r)}: {said}")
