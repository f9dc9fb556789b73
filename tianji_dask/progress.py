"""Live progress for the CLI: one compact line, updated in place on a terminal,
printed every few seconds otherwise (CI logs, pipes)."""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.console import Console, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from tianji_dask.config.schema import StopConfig


def _fmt(x: float | None, spec: str = ".0f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


@dataclass(frozen=True)
class StopProgress:
    """How far a run is toward the stop budget it will meet first: ``fraction`` in [0, 1],
    ``eta_s`` the seconds left at the rate so far (None until a rate is known), ``rule`` the
    budget's name (``max_env_steps`` or ``max_seconds``)."""

    fraction: float
    eta_s: float | None
    rule: str


def stop_progress(row: dict, max_env_steps: int | None, max_seconds: float | None) -> StopProgress | None:
    """The nearest of the run's budgets (``stop.max_env_steps``, ``stop.max_seconds``) from a
    metrics row (``time``, ``env_steps``); None when the run has neither. A return target has no
    ETA: returns do not grow at a rate."""
    t = float(row.get("time", 0.0) or 0.0)
    steps = float(row.get("env_steps", 0) or 0)
    candidates: list[StopProgress] = []
    if max_seconds is not None:
        candidates.append(StopProgress(min(1.0, t / max_seconds), max(0.0, max_seconds - t), "max_seconds"))
    if max_env_steps is not None:
        rate = steps / t if t > 0 and steps > 0 else None
        eta = max(0.0, (max_env_steps - steps) / rate) if rate else None
        candidates.append(StopProgress(min(1.0, steps / max_env_steps), eta, "max_env_steps"))
    if not candidates:
        return None
    known = [c for c in candidates if c.eta_s is not None]
    return min(known, key=lambda c: c.eta_s or 0.0) if known else max(candidates, key=lambda c: c.fraction)


def progress_line(row: dict, target: float | None, *, off_policy: bool = True) -> str:
    """The run's figures in one line: time, env steps and their rate, the learner's rate, the
    mean return of the last 100 episodes (of ``target``), the replay ratio (``off_policy``
    algorithms only: an on-policy one learns each rollout once) and the learner's updates."""
    return "  ".join(text for _, text in _fields(row, target, off_policy))


# a field's rank: the lowest go first where the line does not fit (a narrow terminal)
_KEEP_ALWAYS, _KEEP, _DROP_LAST, _DROP_FIRST = 0, 1, 2, 3


def _fields(row: dict, target: float | None, off_policy: bool, *, aligned: bool = True) -> list[tuple[int, str]]:
    """``aligned``: the time and step counts padded to a fixed width, for lines one under another."""
    ret = _fmt(row.get("return_mean_100"), ".1f")
    goal = f"/{target:g}" if target is not None else ""
    t, steps = row.get("time", 0.0), int(row.get("env_steps", 0))
    fields = [
        (_KEEP_ALWAYS, f"{t:6.1f}s" if aligned else f"{t:.1f}s"),
        (_KEEP_ALWAYS, f"steps {steps:>9,}" if aligned else f"steps {steps:,}"),
        (_KEEP, f"{_fmt(row.get('env_fps'), ',.0f')} steps/s"),
        (_DROP_FIRST, f"train {_fmt(row.get('train_fps'), ',.0f')} samples/s"),
        (_KEEP_ALWAYS, f"return(100) {ret}{goal}"),
    ]
    if off_policy:
        fields.append((_DROP_LAST, f"replay ratio {_fmt(row.get('replay_ratio'), '.1f')}"))
    fields.append((_DROP_LAST, f"updates {int(row.get('updates', 0) or 0):,}"))
    return fields


def percent(fraction: float) -> int:
    """Whole percent, rounded down: 100 only once the budget is spent."""
    return math.floor(fraction * 100)


def eta_text(seconds: float | None) -> str:
    """``ETA 1:23`` (minutes:seconds), ``ETA 1:02:03`` past an hour, ``ETA -:--`` while unknown."""
    if seconds is None or math.isnan(seconds):
        return "ETA -:--"
    s = int(math.ceil(seconds))
    h, m = divmod(s // 60, 60)
    return f"ETA {h}:{m:02d}:{s % 60:02d}" if h else f"ETA {m}:{s % 60:02d}"


def log_line(row: dict, stop: StopConfig, *, off_policy: bool = True) -> str:
    """The progress line of a log file or pipe: ``[ 42%] ETA 1:23`` toward the stop budget met
    first (none without ``stop.max_env_steps`` and ``stop.max_seconds``), then the figures."""
    budget = stop_progress(row, stop.max_env_steps, stop.max_seconds)
    line = progress_line(row, stop.target_return, off_policy=off_policy)
    if budget is None:
        return line
    return f"[{percent(budget.fraction):3d}%] {eta_text(budget.eta_s)} {line}"


def _bar_width(width: int) -> int:
    """Columns of the terminal's bar: fewer on a narrow terminal, none on a very narrow one."""
    return 20 if width >= 120 else 10 if width >= 70 else 0


def terminal_line(row: dict, stop: StopConfig, width: int, *, off_policy: bool = True) -> RenderableType:
    """The progress line of a terminal ``width`` columns wide: a bar, the percentage and ETA
    toward the stop budget met first, then as many of the figures as fit, the least telling
    (the learner's rate, then the replay ratio and updates) left out first."""
    budget = stop_progress(row, stop.max_env_steps, stop.max_seconds)
    fields = _fields(row, stop.target_return, off_policy, aligned=False)
    head = ""
    bar_width = 0
    if budget is not None:
        bar_width = _bar_width(width)
        head = f"{percent(budget.fraction)}% {eta_text(budget.eta_s)}  "
    room = width - 1 - (bar_width + 1 if bar_width else 0) - len(head)
    for rank in (_DROP_FIRST, _DROP_LAST, _KEEP):
        if len("  ".join(text for _, text in fields)) <= room:
            break
        fields = [f for f in fields if f[0] < rank]
    text = Text(head + "  ".join(t for _, t in fields), no_wrap=True, overflow="ellipsis")
    text.truncate(room + len(head), overflow="ellipsis")  # what must stay, cut short on a very narrow one
    if not bar_width:
        return text
    grid = Table.grid(padding=(0, 1))
    grid.add_column(width=bar_width, no_wrap=True)
    grid.add_column(no_wrap=True, overflow="ellipsis")
    grid.add_row(ProgressBar(total=1.0, completed=budget.fraction if budget else 0.0, width=bar_width), text)
    return grid


def summary_line(result) -> str:
    """How a run ended, in one line: its status, env steps, wall time, time to target and the
    mean return of the last 100 episodes at its end (which may have dipped under the target
    again once the run crossed it). A run stopped by an evaluation (``eval_target_reached``) gives
    its time to the eval target instead: when the policy that reached it was taken."""
    if result.status == "eval_target_reached":
        target, ttt = "eval target", result.time_to_eval_target_s
    else:
        target, ttt = "target", result.time_to_target_s
    ttt_text = "not reached" if math.isnan(ttt) else f"{ttt:.1f} s"
    return (
        f"{result.status}: {result.env_steps:,} env steps in {result.wall_s:.1f} s, "
        f"time to {target} {ttt_text}, return(100) at the end {result.return_mean_100:.1f}"
    )


def plain_console(stderr: bool = True) -> Console:
    """A rich console that wraps lines only on a terminal: off one (a log file, a pipe) a
    message, and the command it suggests, stays on its line."""
    console = Console(stderr=stderr)
    console.soft_wrap = not console.is_terminal
    return console


class Progress:
    """The run's progress on the CLI: ``update(row)`` from any thread; ``event(text)`` prints a
    message line; ``close()``. On a terminal one line updated in place (:func:`terminal_line`),
    elsewhere a :func:`log_line` every ``every_s`` seconds. ``stop``: the run's stop rules (the
    budget met first gives the bar and ETA, the return target the return's goal);
    ``off_policy``: the algorithm's replay ratio is shown (``AlgorithmSpec.off_policy``)."""

    def __init__(self, stop: StopConfig, *, off_policy: bool, console: Console | None = None, every_s: float = 5.0):
        self.console = console or plain_console()
        self.stop = stop
        self.off_policy = off_policy
        self.every_s = every_s
        self._last_print = 0.0
        self._live: Live | None = None
        if self.console.is_terminal:
            self._live = Live(Text("starting..."), console=self.console, refresh_per_second=4, transient=False)
            self._live.start()

    def update(self, row: dict) -> None:
        if self._live is not None:
            self._live.update(terminal_line(row, self.stop, self.console.width, off_policy=self.off_policy))
        elif time.monotonic() - self._last_print >= self.every_s:
            self._last_print = time.monotonic()
            print(log_line(row, self.stop, off_policy=self.off_policy), file=sys.stderr, flush=True)

    def event(self, text: str) -> None:
        self.console.print(text, highlight=False)

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
