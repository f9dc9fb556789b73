"""Live progress for the CLI: one compact line, updated in place on a terminal,
printed every few seconds otherwise (CI logs, pipes)."""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass

from rich.console import Console
from rich.live import Live
from rich.text import Text


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


def progress_line(row: dict, target: float | None) -> str:
    ret = _fmt(row.get("return_mean_100"), ".1f")
    goal = f"/{target:g}" if target is not None else ""
    return (
        f"{row.get('time', 0.0):6.1f}s  steps {int(row.get('env_steps', 0)):>9,}  "
        f"{_fmt(row.get('env_fps'))} steps/s  train {_fmt(row.get('train_fps'))} samples/s  "
        f"return(100) {ret}{goal}  replay ratio {_fmt(row.get('replay_ratio'), '.1f')}  "
        f"updates {int(row.get('updates', 0) or 0):,}"
    )


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
    """``update(row)`` from any thread; ``event(text)`` prints a message line; ``close()``."""

    def __init__(self, target: float | None, console: Console | None = None, every_s: float = 5.0):
        self.console = console or plain_console()
        self.target = target
        self.every_s = every_s
        self._last_print = 0.0
        self._live = None
        if self.console.is_terminal:
            self._live = Live(Text("starting..."), console=self.console, refresh_per_second=4, transient=False)
            self._live.start()

    def update(self, row: dict) -> None:
        line = progress_line(row, self.target)
        if self._live is not None:
            self._live.update(Text(line))
        elif time.monotonic() - self._last_print >= self.every_s:
            self._last_print = time.monotonic()
            print(line, file=sys.stderr, flush=True)

    def event(self, text: str) -> None:
        self.console.print(text, highlight=False)

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
