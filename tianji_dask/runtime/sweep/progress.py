"""A sweep's progress for the CLI. Each run's start and end is a line. While runs go: on a
terminal, a table of the running runs updated in place; elsewhere (a log file, a pipe), one line
per running run every few seconds, prefixed by its name. Each says the run's env steps, its
return(100) and how far it is toward its nearest stop budget, with the ETA at its rate so far
(:func:`tianji_dask.progress.stop_progress`). The end table is ``tianji-dask summary``'s
(:func:`tianji_dask.results.shell.print_table`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from tianji_dask.progress import plain_console, stop_progress

if TYPE_CHECKING:
    from tianji_dask.runtime.sweep.runner import SweepRun


def _fmt(x, spec: str = ".1f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def clock(seconds: float) -> str:
    """``42`` -> ``0:42``, ``3723`` -> ``1:02:03``."""
    s = int(round(seconds))
    h, m = divmod(s // 60, 60)
    return f"{h}:{m:02d}:{s % 60:02d}" if h else f"{m}:{s % 60:02d}"


def _return_text(r: SweepRun) -> str:
    target = r.cfg.stop.target_return
    return _fmt((r.row or {}).get("return_mean_100")) + (f"/{target:g}" if target is not None else "")


def run_line(label: str, r: SweepRun) -> str:
    """``[2/4] seed=1: 12,345 env steps, return(100) 45.2/475, 41% of max_env_steps, ETA 0:23``
    (``starting`` before its first metrics row)."""
    if r.row is None:
        return f"{label}: starting"
    row = r.row
    text = f"{label}: {int(row.get('env_steps', 0) or 0):,} env steps, return(100) {_return_text(r)}"
    p = stop_progress(row, r.cfg.stop.max_env_steps, r.cfg.stop.max_seconds)
    if p is not None:
        text += f", {p.fraction:.0%} of {p.rule}" + (f", ETA {clock(p.eta_s)}" if p.eta_s is not None else "")
    return text


class SweepProgress:
    """``line(text)`` for each run's start and end, ``update(runs)`` as often as wanted (the
    sweep's ``on_runs``), ``close()`` at the end."""

    def __init__(self, console: Console | None = None, every_s: float = 5.0):
        self.console = console or plain_console(stderr=False)
        self.every_s = every_s
        self._last_print = time.monotonic()
        self._live: Live | None = None
        if self.console.is_terminal:
            self._live = Live(Text(""), console=self.console, refresh_per_second=2, transient=True)
            self._live.start()

    def line(self, text: str) -> None:
        if self._live is not None:  # printed above the live table
            self.console.print(text, highlight=False, markup=False)
            return
        # a plain write: rich's print empties its buffer after the write, so a Ctrl-C between the
        # two would have the next line print this one again
        out = self.console.file
        out.write(text + "\n")
        out.flush()

    def update(self, runs: Sequence[SweepRun]) -> None:
        labels = {id(r): f"[{k}/{len(runs)}] {r.name}" for k, r in enumerate(runs, start=1)}
        running = [r for r in runs if r.status == "running"]
        if self._live is not None:
            self._live.update(self._table(runs, running, labels))
        elif time.monotonic() - self._last_print >= self.every_s:
            self._last_print = time.monotonic()
            for r in running:
                self.line(run_line(labels[id(r)], r))

    def _table(self, runs: Sequence[SweepRun], running: list[SweepRun], labels: dict[int, str]) -> Group:
        table = Table(box=None, pad_edge=False, header_style="bold")
        for name, justify in (("run", "left"), ("env steps", "right"), ("return(100)", "right"), ("toward", "left")):
            table.add_column(name, justify=justify)  # type: ignore[arg-type]
        table.add_column("", width=20)
        table.add_column("ETA", justify="right")
        for r in running:
            if r.row is None:
                table.add_row(labels[id(r)], "-", "-", "starting")
                continue
            row = r.row
            p = stop_progress(row, r.cfg.stop.max_env_steps, r.cfg.stop.max_seconds)
            table.add_row(
                labels[id(r)],
                f"{int(row.get('env_steps', 0) or 0):,}",
                _return_text(r),
                f"{p.fraction:.0%} of {p.rule}" if p is not None else "no budget",
                ProgressBar(total=1.0, completed=p.fraction if p is not None else 0.0, width=20),
                clock(p.eta_s) if p is not None and p.eta_s is not None else "-",
            )
        ended = sum(r.status not in ("running", "waiting") for r in runs)
        waiting = sum(r.status == "waiting" for r in runs)
        return Group(table, Text(f"{len(running)} running, {ended} ended, {waiting} waiting", style="dim"))

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
