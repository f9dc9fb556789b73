"""The CLI's progress and message lines off a terminal (a log file, a pipe, CI)."""

from __future__ import annotations

import math
from pathlib import Path

from tianji_dask.progress import Progress, summary_line
from tianji_dask.runtime.driver import RunResult


def test_a_message_off_a_terminal_stays_on_its_line(capsys):
    ready = "hosts ready (the slowest of each role): " + ", ".join(
        f"actor {i} in 7.2 s (built in 7.2 s, its envs 6.5 s)" for i in range(3)
    )
    progress = Progress(target=18.0)
    progress.event(ready)
    progress.update({"time": 5.0, "env_steps": 1000, "env_fps": 200.0})
    progress.close()
    lines = capsys.readouterr().err.splitlines()
    assert ready in lines, lines
    assert any(line.startswith("   5.0s  steps     1,000  200 steps/s") for line in lines), lines


def test_the_summary_says_the_return_it_gives_is_the_one_at_the_runs_end():
    """A run stops once the mean return crossed the target; by then a few more episodes may have
    pulled it under again, so the summary names the time to target first and the return as the
    one at the end."""
    reached = RunResult("target_reached", Path("run"), 12.34, 20_000, 297.31, 7.42)
    assert summary_line(reached) == (
        "target_reached: 20,000 env steps in 12.3 s, time to target 7.4 s, return(100) at the end 297.3"
    )
    stopped = RunResult("max_env_steps", Path("run"), 60.0, 500_000, 120.0, math.nan)
    assert "time to target not reached, return(100) at the end 120.0" in summary_line(stopped)
