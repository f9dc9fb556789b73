"""Runs started from a notebook: live progress in place, the dashboard link, results as xarray.

::

    from distributed import Client, LocalCluster
    import tianji_dask

    cluster = LocalCluster(n_workers=2, threads_per_worker=1)   # your cluster: start() never makes one
    client = Client(cluster)
    run = tianji_dask.start("../configs/cartpole_dqn.yaml", client, overrides=["seed=1"])
    run.metrics()                  # xarray Dataset of the rows recorded so far, while it runs
    run.wait()                     # blocks; returns the RunResult (run.stop() ends it early)
    result, ds = run.results       # the RunResult and open_run(run_dir), once it has ended

:func:`start` is :func:`tianji_dask.runtime.driver.train` with a client you made (a LocalCluster's, a
SLURMCluster's...), plus a progress display. In a Jupyter kernel the display is one output that
is updated in place (``IPython.display`` with a ``display_id``: no widgets, so it also renders
when the notebook is executed headless by nbclient or nbconvert); elsewhere it is the CLI's
progress line on stderr.
"""

from __future__ import annotations

import contextlib
import html
import json
import math
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

from tianji_dask.algos.registry import spec_for
from tianji_dask.config import ExperimentConfig, apply_overrides, load_config, validate_config
from tianji_dask.progress import progress_line
from tianji_dask.runtime.driver import Run, RunResult, train

__all__ = ["NotebookRun", "Results", "slurm_status", "start"]

MAX_EVENTS = 5  # event lines (lost hosts, shared workers...) kept in the display


class Results(NamedTuple):
    """A finished run: ``result`` (:class:`~tianji_dask.runtime.driver.RunResult`: status, run_dir,
    time_to_target_s...) and ``ds``, the run directory opened with
    :func:`tianji_dask.results.analysis.open_run` (``ds.tianji`` plots it)."""

    result: RunResult
    ds: Any


def start(
    config: ExperimentConfig | str | Path,
    client,
    *,
    overrides=(),
    plan=None,
    out: str | Path | None = None,
    display: bool = True,
    refresh_s: float = 1.0,
) -> NotebookRun:
    """Start a run on ``client``'s cluster and return its :class:`NotebookRun` handle at once.

    ``config``: an ``ExperimentConfig`` or the path of a YAML config. ``overrides``: ``--set``
    strings (``["seed=1", "stop.max_seconds=60"]``) or a dict (``{"seed": 1}``), applied in
    order. ``plan``: a :class:`~tianji_dask.deploy.planner.Plan` whose topology and batch are applied
    last (as ``tianji-dask train --plan``). ``out``: the run directory (new or empty); default
    ``runs/<env>__<algo>__<seed>__<time>`` below the current directory. ``client``: a
    ``distributed.Client`` you created; the run uses its workers as they are and leaves the
    cluster open. ``display``: show live progress (refreshed every ``refresh_s`` seconds).
    Bad config input raises :class:`~tianji_dask.config.ConfigError` before anything starts.
    """
    if client is None or not hasattr(client, "submit"):
        what = "None" if client is None else type(client).__name__
        raise TypeError(
            f"start() needs a distributed.Client of a cluster you started, got {what}; e.g.\n"
            "    cluster = LocalCluster(n_workers=2, threads_per_worker=1)\n"
            "    client = Client(cluster)\n"
            "    run = tianji_dask.start(config, client)"
        )
    cfg = _resolve_config(config, overrides)
    if plan is not None:
        cfg = plan.apply(cfg)
    view = _view(cfg, client, refresh_s) if display else _View()
    try:
        run = train(cfg, client, out=out, on_row=view.row, on_event=view.event)
    except BaseException:
        view.close()
        raise
    return NotebookRun(run, client, view)


def resume(
    run_dir: str | Path,
    client,
    *,
    overrides=(),
    display: bool = True,
    refresh_s: float = 1.0,
) -> NotebookRun:
    """Continue a stopped, crashed or time-limited run in its own directory on ``client``'s
    cluster (as ``tianji-dask train --resume RUN_DIR``) and return its :class:`NotebookRun`.

    ``overrides``: ``--set`` strings or a dict of ``stop.*`` and ``run.*`` keys only (a new
    target, a longer budget: ``{"stop.max_seconds": 600}``). The learner continues from the
    run's checkpoint; ``metrics.nc`` and ``episodes.nc`` are extended. A directory that no run
    wrote, a missing checkpoint, an override of the experiment or a stop rule the run already met
    raises :class:`~tianji_dask.config.ConfigError` with nothing changed."""
    from tianji_dask.results.resumable import check_resumable
    from tianji_dask.runtime.driver import Run

    if client is None or not hasattr(client, "submit"):
        raise TypeError("resume() needs a distributed.Client of a cluster you started, as start() does")
    if isinstance(overrides, dict):
        overrides = [f"{k}={json.dumps(v)}" for k, v in overrides.items()]
    point = check_resumable(run_dir, list(overrides))  # read once: the checkpoint and both files
    view = _view(point.cfg, client, refresh_s) if display else _View()
    try:
        run = Run(point.cfg, client=client, on_row=view.row, on_event=view.event, resume=point)
    except BaseException:
        view.close()
        raise
    return NotebookRun(run, client, view)


def _resolve_config(config, overrides) -> ExperimentConfig:
    if isinstance(overrides, str):
        raise TypeError(
            f"overrides must be a list of 'key=value' strings or a dict, got the string {overrides!r}; "
            f"write overrides=[{overrides!r}]"
        )
    items = [(k.split("."), v) for k, v in overrides.items()] if isinstance(overrides, dict) else list(overrides)
    if isinstance(config, ExperimentConfig):
        if not items:
            return config
        return validate_config(apply_overrides(config.model_dump(mode="json"), items))
    if isinstance(config, (str, Path)):
        strings = [i if isinstance(i, str) else f"{'.'.join(i[0])}={json.dumps(i[1])}" for i in items]
        return load_config(config, strings)
    raise TypeError(f"config must be an ExperimentConfig or the path of a YAML config, got {type(config).__name__}")


class NotebookRun:
    """Handle to a run started by :func:`start` (the driver's :class:`~tianji_dask.runtime.driver.Run`
    is ``.run``). Its repr in a notebook is the same live view."""

    def __init__(self, run: Run, client, view: _View | None = None):
        self.run = run
        self.client = client
        self._view = view or _View()
        self._results: Results | None = None
        self._view.attach(run)

    # --- the run ----------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.run.name

    @property
    def run_dir(self) -> Path:
        return self.run.run_dir

    @property
    def dashboard_link(self) -> str | None:
        """The Dask dashboard of the cluster the run is on."""
        return self.run.dashboard_link or getattr(self.client, "dashboard_link", None)

    @property
    def done(self) -> bool:
        return self.run.done

    @property
    def result(self) -> RunResult | None:
        """The :class:`~tianji_dask.runtime.driver.RunResult` once the run has ended, else None."""
        return self.run.result

    def wait(self, timeout: float | None = None) -> RunResult | None:
        """Block until the run has ended and its files are written (None on timeout). Interrupting
        the kernel while it waits stops the run (results are still written) and re-raises."""
        try:
            result = self.run.wait(timeout)
        except KeyboardInterrupt:
            self.run.stop("stopped")
            self.run.wait()
            self._view.refresh(force=True)
            raise
        if result is not None:
            self._view.refresh(force=True)
        return result

    def stop(self, wait: bool = True) -> RunResult | None:
        """End the run early (status ``stopped``); with ``wait`` block until its files are written."""
        self.run.stop("stopped")
        return self.wait() if wait else None

    def metrics(self):
        """The metrics rows recorded so far, as an ``xarray.Dataset`` (docs/metrics.md)."""
        return self.run.metrics()

    def episodes(self):
        """The episodes finished so far, as an ``xarray.Dataset``."""
        return self.run.episodes()

    @property
    def results(self) -> Results:
        """``Results(result, ds)`` of the finished run; ``ds = open_run(run_dir)``. Raises
        RuntimeError while it runs (``wait()`` first, or ``metrics()`` for the rows so far)."""
        if not self.run.done:
            raise RuntimeError(
                f"run {self.name} is still running: call .wait() (or .stop()) first, "
                "or .metrics() for what has been recorded so far"
            )
        if self._results is None:
            from tianji_dask.results.analysis import open_run

            result = self.run.result
            assert result is not None  # a run that is done has its result
            self._results = Results(result, open_run(self.run.run_dir))
        return self._results

    # --- display ----------------------------------------------------------------------------
    def _bundle(self) -> dict[str, str]:
        return _render(self.run, self._view.last_row, self.dashboard_link, self._view.events)

    def _repr_html_(self) -> str:
        return self._bundle()["text/html"]

    def __repr__(self) -> str:
        return self._bundle()["text/plain"]


# ------------------------------------------------------------------------------- the live view
def _in_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def _view(cfg: ExperimentConfig, client, refresh_s: float) -> _View:
    return _KernelView(client, refresh_s) if _in_kernel() else _ConsoleView(cfg)


class _View:
    """No display: keeps the latest metrics row and the last event lines for the handle's repr."""

    def __init__(self):
        self.run: Run | None = None
        self.last_row: dict = {"time": 0.0, "env_steps": 0}
        self.events: list[str] = []
        self._lock = threading.Lock()

    def attach(self, run: Run) -> None:
        self.run = run

    def row(self, row: dict) -> None:
        self.last_row = row
        self.refresh()

    def event(self, text: str) -> None:
        if text.startswith("dashboard: "):
            return  # the link is shown on its own line
        with self._lock:
            self.events = [*self.events, text][-MAX_EVENTS:]
        self.refresh(force=True)

    def refresh(self, force: bool = False) -> None: ...

    def close(self) -> None: ...


class _ConsoleView(_View):
    """Outside Jupyter: the CLI's progress (a line updated in place on a terminal)."""

    def __init__(self, cfg: ExperimentConfig):
        from tianji_dask.progress import Progress

        super().__init__()
        self._progress = Progress(cfg.stop, off_policy=spec_for(cfg).off_policy)
        self._closed = False

    def attach(self, run: Run) -> None:
        super().attach(run)
        self._progress.event(f"run directory: {run.run_dir}")
        threading.Thread(target=self._finish, args=(run,), name=f"tianji-view-{run.id}", daemon=True).start()

    def row(self, row):
        super().row(row)
        self._progress.update(row)

    def event(self, text):
        super().event(text)
        self._progress.event(text)

    def _finish(self, run: Run) -> None:
        result = run.wait()
        self.close()
        if result is not None:
            import sys

            print(_summary(result), file=sys.stderr, flush=True)

    def close(self):
        if not self._closed:
            self._closed = True
            self._progress.close()


class _KernelView(_View):
    """In a Jupyter kernel: one display output, updated in place from the driver's thread."""

    def __init__(self, client, refresh_s: float = 1.0):
        from IPython.display import display

        super().__init__()
        self._dashboard = getattr(client, "dashboard_link", None)
        self._last = 0.0
        self._refresh_s = refresh_s
        self._handle = display(
            {
                "text/plain": "tianji-dask: starting the run...",
                "text/html": "<code>tianji-dask: starting the run...</code>",
            },
            raw=True,
            display_id=True,
        )

    def attach(self, run: Run) -> None:
        super().attach(run)
        self.refresh(force=True)
        threading.Thread(target=self._finish, args=(run,), name=f"tianji-view-{run.id}", daemon=True).start()

    def refresh(self, force: bool = False) -> None:
        if self.run is None:
            return
        now = time.monotonic()
        with self._lock:
            if not force and now - self._last < self._refresh_s:
                return
            self._last = now
            bundle = _render(self.run, self.last_row, self.run.dashboard_link or self._dashboard, list(self.events))
            with contextlib.suppress(Exception):  # a closed kernel channel must not break the run
                self._handle.update(bundle, raw=True)

    def _finish(self, run: Run) -> None:
        run.wait()
        self.refresh(force=True)

    def close(self) -> None:
        if self.run is None:  # train() refused the config or the run directory: say so in place
            text = "tianji-dask: the run did not start (see the error below)"
            self._handle.update({"text/plain": text, "text/html": f"<code>{text}</code>"}, raw=True)


# ------------------------------------------------------------------------------- rendering
def _fraction(run: Run, row: dict) -> tuple[float, str]:
    """How far the run is towards its first stop rule, 0..1, and which rule that is."""
    s = run.cfg.stop
    parts = []
    ret = row.get("return_mean_100")
    if s.target_return is not None and ret is not None and not math.isnan(ret) and s.target_return > 0:
        parts.append((ret / s.target_return, f"return(100) {ret:.1f} of {s.target_return:g}"))
    if s.max_env_steps:
        steps = int(row.get("env_steps", 0) or 0)
        parts.append((steps / s.max_env_steps, f"{steps:,} of {s.max_env_steps:,} env steps"))
    if s.max_seconds:
        t = float(row.get("time", 0.0) or 0.0)
        parts.append((t / s.max_seconds, f"{t:.0f} of {s.max_seconds:g} s"))
    if not parts:
        return 0.0, ""
    frac, label = max(parts, key=lambda p: p[0])
    return min(max(frac, 0.0), 1.0), label


def _summary(result: RunResult) -> str:
    ttt = "not reached" if math.isnan(result.time_to_target_s) else f"{result.time_to_target_s:.1f} s"
    text = (
        f"{result.status}: {result.env_steps:,} env steps in {result.wall_s:.1f} s, "
        f"return(100) {result.return_mean_100:.1f}, time to target {ttt}"
    )
    if result.error:
        text += f"\nerror: {result.error.strip().splitlines()[0]}"
    return text


def _render(run: Run, last_row: dict, dashboard: str | None, events: list[str]) -> dict[str, str]:
    result = run.result
    row = dict(result.final_row) if result is not None and result.final_row else dict(last_row)
    frac, label = _fraction(run, row)
    state = result.status if result is not None else "running"
    head = f"tianji-dask {run.name}: {state}"
    bar = "#" * round(frac * 30) + "-" * (30 - round(frac * 30))
    figures = progress_line(row, run.cfg.stop.target_return, off_policy=spec_for(run.cfg).off_policy)
    lines = [
        head,
        f"dashboard: {dashboard or '-'}",
        f"[{bar}] {frac:4.0%}  {label}",
        figures,
    ]
    if result is not None:
        lines.append(_summary(result))
    lines.append(f"run directory: {run.run_dir}")
    lines += events
    text = "\n".join(lines)

    esc = html.escape
    colour = {"running": "#1f77b4", "failed": "#d62728", "stopped": "#ff7f0e"}.get(state, "#2ca02c")
    link = f'<a href="{esc(dashboard)}" target="_blank">{esc(dashboard)}</a>' if dashboard else "-"
    rows = [
        f'<b>tianji-dask</b> <code>{esc(run.name)}</code>: <b style="color:{colour}">{esc(state)}</b>',
        f"dashboard: {link}",
        f'<progress value="{frac:.3f}" max="1" style="width:20em"></progress> {frac:.0%} <small>{esc(label)}</small>',
        f"<code>{esc(figures)}</code>",
    ]
    if result is not None:
        rows.append(f"<code>{esc(_summary(result))}</code>".replace("\n", "<br>"))
    rows.append(f"<small>run directory: <code>{esc(str(run.run_dir))}</code></small>")
    rows += [f"<small>{esc(e)}</small>" for e in events]
    return {"text/plain": text, "text/html": "<div>" + "<br>".join(rows) + "</div>"}


# ------------------------------------------------------------------------------- Slurm
def slurm_status(timeout: float = 15.0) -> tuple[bool, str]:
    """Whether a Slurm answers here: ``(True, what sinfo says)`` or ``(False, why not)``.

    Uses ``SLURM_CONF`` when it is set (as ``jobqueue/local-slurm.sh env`` exports it), else the
    system's Slurm configuration. Never raises."""
    import os
    import shutil
    import subprocess

    conf = os.environ.get("SLURM_CONF")
    if conf and not Path(conf).is_file():
        return False, f"SLURM_CONF={conf} does not exist"
    if shutil.which("sinfo") is None:
        return False, "sinfo is not installed (no Slurm client on this machine)"
    where = f"SLURM_CONF={conf}" if conf else "the system's slurm.conf (SLURM_CONF is not set)"
    try:
        r = subprocess.run(
            ["sinfo", "-h", "-o", "%P %D %t %c %m"],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return False, f"sinfo ({where}) did not answer within {timeout:g} s"
    except OSError as exc:
        return False, f"sinfo failed to start: {exc}"
    if r.returncode != 0:
        err = (r.stderr or r.stdout).strip().splitlines()
        return False, f"sinfo ({where}) failed: {err[-1] if err else f'exit {r.returncode}'}"
    lines = r.stdout.strip().splitlines()
    usable = [
        ln
        for ln in lines
        if len(ln.split()) >= 3
        and ln.split()[2].rstrip("*~#!%$@^-") in {"idle", "mix", "mixed", "alloc", "allocated", "comp"}
    ]
    if not usable:
        return False, f"no usable partition in sinfo ({where}): {lines or 'no nodes'}"
    return True, f"{where}: partition nodes state cpus memory(MB): " + "; ".join(usable)
