"""Many runs of one config at once: a grid of ``--set`` values, ``parallel`` runs at a time
(``tianji-dask sweep``, :func:`sweep`).

Every combination of the grid's values is a run with its own hosts and its own directory under
the sweep's (``seed=0__algo.lr=0.0003``). All configs are loaded and checked before the first run
starts, so a bad key or value is refused with nothing started or written. Without a client each
run starts its own LocalCluster, as ``tianji-dask train`` does; with one, the runs share that
cluster's workers; with one client per slot (``clients``, K of them: e.g. K planned Slurm
allocations, ``deploy/slurm_sweep.py``), each run goes to a slot no other run holds. A run that
fails is recorded ``failed`` in its files and the others go on; one line is printed as each run
starts and ends. :meth:`Sweep.open` stacks the results with
:func:`~tianji_dask.results.analysis.open_runs`.
"""

from __future__ import annotations

import datetime as _dt
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tianji_dask.config import ConfigError, ExperimentConfig, load_config
from tianji_dask.config.deployment import deployment_settings
from tianji_dask.config.loading import parse_override

if TYPE_CHECKING:
    from tianji_dask.runtime.driver import Run

POLL_S = 0.2


def parse_grid(texts: Sequence[str]) -> list[tuple[str, list[str]]]:
    """``["seed=0,1,2", "algo.lr=1e-4,3e-4"]`` -> ``[("seed", ["0", "1", "2"]), ("algo.lr", [...])]``;
    a :class:`ConfigError` naming the form for a malformed entry or a key given twice."""
    grid: list[tuple[str, list[str]]] = []
    for text in texts:
        key, sep, values = text.partition("=")
        parse_override(f"{key.strip()}=0")  # the key's form, as --set checks it
        items = [v.strip() for v in values.split(",")]
        if not sep or not all(items):
            raise ConfigError(f"--grid {text!r}: expected --grid key.path=V1,V2,... (values separated by commas)")
        if key.strip() in dict(grid):
            raise ConfigError(f"--grid {text!r}: {key.strip()} is given twice; give all its values in one --grid")
        grid.append((key.strip(), items))
    if not grid:
        raise ConfigError("a sweep needs at least one --grid key.path=V1,V2,...")
    return grid


def _run_name(combination: Sequence[tuple[str, str]]) -> str:
    name = "__".join(f"{k}={v}" for k, v in combination)
    return "".join(c if c.isalnum() or c in "._=-" else "-" for c in name)


@dataclass
class SweepRun:
    """One combination of the grid: its overrides, config and directory, and once started its
    :class:`~tianji_dask.runtime.driver.Run` handle."""

    name: str
    overrides: list[str]
    cfg: ExperimentConfig
    run_dir: Path
    handle: Run | None = None
    status: str = "waiting"
    error: str | None = None
    slot: int | None = None  # which of the ``parallel`` places it runs in, once started


@dataclass
class Sweep:
    """A sweep's runs, in grid order, after :func:`sweep` returned."""

    out: Path
    runs: list[SweepRun] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.status not in ("failed", "stopped", "waiting") for r in self.runs)

    def run(
        self,
        parallel: int = 1,
        client=None,
        on_line: Callable[[str], None] = print,
        *,
        clients: Sequence | None = None,
    ) -> Sweep:
        """Run them, ``parallel`` at a time, and return when all have ended (Ctrl-C stops those
        running, their results written); each run's :attr:`SweepRun.handle` is set as it starts.
        ``clients``: one client per slot instead of ``client`` (``parallel`` of them), a run on
        each at a time."""
        if parallel < 1:
            raise ConfigError(f"parallel={parallel}: at least one run at a time")
        if clients is not None and (client is not None or len(clients) != parallel):
            raise ConfigError(f"clients: give one per slot ({parallel}, as parallel), and no client beside them")
        self.out.mkdir(parents=True, exist_ok=True)
        _Runner(self, list(clients) if clients is not None else [client] * parallel, on_line).run()
        return self

    def open(self):
        """The runs that wrote results, stacked (:func:`~tianji_dask.results.analysis.open_runs`)."""
        from tianji_dask.results.analysis import open_runs

        return open_runs([r.run_dir for r in self.runs if (r.run_dir / "metrics.nc").exists()])


def plan_sweep(
    config: str | Path, grid: Sequence[str], overrides: Sequence[str] = (), out: str | Path | None = None
) -> Sweep:
    """The sweep's runs, every config loaded and checked, the directory chosen: nothing written.
    ``out`` must be new or empty (default ``<runs-dir>/sweeps/<config>__<time>``)."""
    axes = parse_grid(grid)
    if out is None:
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        out = deployment_settings().runs_dir / "sweeps" / f"{Path(config).stem}__{stamp}"
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"sweep directory {out} exists and is not empty; give a new one (--out) or remove it")
    runs = []
    for values in itertools.product(*(vals for _, vals in axes)):
        combination = [(key, v) for (key, _), v in zip(axes, values)]
        sets = [*overrides, *(f"{k}={v}" for k, v in combination)]
        name = _run_name(combination)
        try:
            cfg = load_config(config, sets)
        except ConfigError as exc:
            raise ConfigError(f"sweep run {name}: {exc}") from None
        runs.append(SweepRun(name, sets, cfg, out / name))
    return Sweep(out, runs)


def sweep(
    config: str | Path,
    grid: Sequence[str],
    *,
    overrides: Sequence[str] = (),
    parallel: int = 1,
    out: str | Path | None = None,
    client=None,
    on_line: Callable[[str], None] = print,
) -> Sweep:
    """Run every combination of ``grid`` (``["seed=0,1,2", ...]``), ``parallel`` at a time:
    :func:`plan_sweep`, then :meth:`Sweep.run`. See the module's docstring."""
    if parallel < 1:
        raise ConfigError(f"parallel={parallel}: at least one run at a time")
    return plan_sweep(config, grid, overrides, out).run(parallel, client, on_line)


class _Runner:
    def __init__(self, planned: Sweep, slots: list, on_line: Callable[[str], None]):
        self.planned, self.slots, self.on_line = planned, slots, on_line  # slots: a client (or None) each
        self.total = len(planned.runs)

    def run(self) -> None:
        waiting = list(self.planned.runs)
        running: list[SweepRun] = []
        try:
            while waiting or running:
                while waiting and len(running) < len(self.slots):
                    held = {r.slot for r in running}
                    slot = next(k for k in range(len(self.slots)) if k not in held)
                    running.append(self._start(waiting.pop(0), slot))
                time.sleep(POLL_S)
                for r in [r for r in running if r.handle is None or r.handle.done]:
                    running.remove(r)
                    self._ended(r)
        except KeyboardInterrupt:
            for r in running:
                if r.handle is not None:
                    r.handle.stop("stopped")
            for r in running:
                self._ended(r)
            raise

    def _start(self, r: SweepRun, slot: int) -> SweepRun:
        from tianji_dask.runtime.driver import train

        k = self.planned.runs.index(r) + 1
        r.slot = slot
        try:
            r.handle = train(r.cfg, self.slots[slot], out=r.run_dir)
        except Exception as exc:  # noqa: BLE001 - a run that cannot start is recorded, the others go on
            r.status, r.error = "failed", f"{type(exc).__name__}: {exc}"
            return r
        r.status = "running"
        self.on_line(f"[{k}/{self.total}] {r.name}: started in {r.run_dir}")
        return r

    def _ended(self, r: SweepRun) -> None:
        k = self.planned.runs.index(r) + 1
        if r.handle is not None:
            result = r.handle.wait()
            r.status, r.error = result.status, result.error
            said = (
                f"{result.status} after {result.env_steps:,} env steps in {result.wall_s:.1f} s, "
                f"return(100) {result.return_mean_100:.1f}"
            )
        else:
            said = "failed to start"
        if r.error:
            said += f": {r.error.strip().splitlines()[0]}"
        self.on_line(f"[{k}/{self.total}] {r.name}: {said}")
