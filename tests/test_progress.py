"""The CLI's progress and message lines off a terminal (a log file, a pipe, CI)."""

from __future__ import annotations

import io
import math
import re
from pathlib import Path

import pytest
from rich.console import Console

from tianji_dask.algos.registry import spec_for
from tianji_dask.config import load_config
from tianji_dask.config.schema import StopConfig
from tianji_dask.progress import Progress, eta_text, log_line, progress_line, summary_line
from tianji_dask.runtime.driver import RunResult


def test_a_message_off_a_terminal_stays_on_its_line(capsys):
    ready = "hosts ready (the slowest of each role): " + ", ".join(
        f"actor {i} in 7.2 s (built in 7.2 s, its envs 6.5 s)" for i in range(3)
    )
    progress = Progress(StopConfig(target_return=18.0, max_seconds=20.0), off_policy=True)
    progress.event(ready)
    progress.update({"time": 5.0, "env_steps": 1000, "env_fps": 200.0})
    progress.close()
    lines = capsys.readouterr().err.splitlines()
    assert ready in lines, lines
    assert any(line.startswith("[ 25%] ETA 0:15    5.0s  steps     1,000  200 steps/s") for line in lines), lines


ROW = {
    "time": 12.3,
    "env_steps": 120_000,
    "env_fps": 9_800.0,
    "train_fps": 78_000.0,
    "return_mean_100": 212.4,
    "replay_ratio": 8.0,
    "updates": 1234,
}


def _on_terminal(cfg, width: int, row: dict) -> list[str]:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=width, color_system=None)
    progress = Progress(cfg.stop, off_policy=spec_for(cfg).off_policy, console=console)
    progress.update(row)
    progress.close()
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())  # Live's cursor moves
    return [line for line in re.split(r"[\r\n]+", text) if line.strip()]


@pytest.mark.parametrize("width", [160, 80, 60])
def test_on_a_terminal_the_line_has_a_bar_and_eta_and_fits_its_width(width):
    """The bar and ETA toward the budget met first (here 100 s: 12.3 s in, 88 s left); figures
    that do not fit a narrow terminal are left out, never wrapped onto a second line."""
    cfg = load_config("configs/cartpole_dqn.yaml", ["stop.max_seconds=100", "stop.max_env_steps=null"])
    lines = _on_terminal(cfg, width, ROW)
    assert len(lines) == 1 and len(lines[0]) <= width, lines
    line = lines[0]
    assert "12% ETA 1:28" in line and "steps 120,000" in line and "return(100) 212.4/300" in line, line
    assert ("━" in line) == (width >= 70), line
    assert ("replay ratio 8.0" in line and "updates 1,234" in line) == (width >= 120), line


def test_a_run_with_no_budget_has_no_bar_and_no_eta():
    cfg = load_config("configs/cartpole_dqn.yaml", ["stop.max_seconds=null", "stop.max_env_steps=null"])
    (line,) = _on_terminal(cfg, 160, ROW)
    assert "ETA" not in line and "%" not in line and "━" not in line, line
    assert log_line(ROW, cfg.stop) == progress_line(ROW, 300.0)


@pytest.mark.parametrize("config,shown", [("cartpole_dqn", True), ("cartpole_ppo", False)])
def test_the_replay_ratio_is_shown_for_off_policy_algorithms_only(config, shown):
    """An on-policy algorithm learns each rollout once: its ratio of samples to transitions is
    no setting and says nothing, on a terminal or off one."""
    cfg = load_config(f"configs/{config}.yaml", ["stop.max_seconds=100"])
    assert ("replay ratio" in _on_terminal(cfg, 200, ROW)[0]) == shown
    off_terminal = Progress(
        cfg.stop, off_policy=spec_for(cfg).off_policy, console=Console(file=io.StringIO(), force_terminal=False)
    )
    assert off_terminal.console.is_terminal is False
    assert ("replay ratio" in log_line(ROW, cfg.stop, off_policy=off_terminal.off_policy)) == shown


def test_eta_text_counts_minutes_and_hours():
    assert [eta_text(s) for s in (None, 0.2, 83.0, 3723.0)] == ["ETA -:--", "ETA 0:01", "ETA 1:23", "ETA 1:02:03"]


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


def test_stop_progress_takes_the_budget_met_first():
    from tianji_dask.progress import stop_progress

    row = {"time": 10.0, "env_steps": 1000}
    assert stop_progress(row, None, None) is None
    by_time = stop_progress(row, 100_000, 40.0)  # steps: 990 s left at 100/s; time: 30 s left
    assert by_time is not None and by_time.rule == "max_seconds" and by_time.eta_s == 30.0
    assert by_time.fraction == 0.25
    by_steps = stop_progress(row, 2000, 600.0)
    assert by_steps is not None and by_steps.rule == "max_env_steps" and by_steps.eta_s == 10.0
    assert by_steps.fraction == 0.5
    start = stop_progress({"time": 0.0, "env_steps": 0}, 2000, None)
    assert start is not None and start.eta_s is None and start.fraction == 0.0


def test_a_run_stopped_by_an_evaluation_gives_its_time_to_the_eval_target():
    """``eval_target_reached`` says when the evaluated policy that reached stop.target_eval_return
    was taken, not the training return's time to target (its stop.target_return may be null)."""
    by_eval = RunResult("eval_target_reached", Path("run"), 40.0, 30_000, 180.0, math.nan, time_to_eval_target_s=31.25)
    assert summary_line(by_eval) == (
        "eval_target_reached: 30,000 env steps in 40.0 s, time to eval target 31.2 s, return(100) at the end 180.0"
    )


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_an_eval_target_run_records_when_its_first_evaluation_reached_the_target(tmp_path):
    """A real serial CartPole run stopped on its evaluations (a target any policy reaches): its
    time to the eval target is the first evaluation's eval_time in metrics.nc."""
    import xarray as xr

    from tianji_dask.config import load_config
    from tianji_dask.runtime.driver import train

    overrides = [
        "stop.target_return=null",
        "stop.target_eval_return=5",
        "run.eval_every_env_steps=500",
        "run.eval_episodes=2",
        "stop.max_seconds=120",
    ]
    result = train(load_config("configs/cartpole_dqn.yaml", overrides), serial=True, out=tmp_path / "run").wait()
    assert result.status == "eval_target_reached", (result.status, result.error)
    with xr.open_dataset(result.run_dir / "metrics.nc", engine="netcdf4") as ds:
        first = float(ds["eval_time"].values[0])
    assert result.time_to_eval_target_s == first
    assert f"time to eval target {first:.1f} s" in summary_line(result)
