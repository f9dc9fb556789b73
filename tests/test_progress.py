"""The CLI's progress and message lines off a terminal (a log file, a pipe, CI)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

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
