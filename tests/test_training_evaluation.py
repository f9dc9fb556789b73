"""Evaluations while a run trains (``run.eval_every_env_steps``): their records in metrics.nc, the
best state kept as checkpoint_best, and a run that goes on when its evaluator process dies. The
learning side (a best checkpoint that plays 450) is test_learning's."""

from __future__ import annotations

import json
import re
import time

import numpy as np
import psutil
import pytest
import xarray as xr
from conftest import wait_until

from tianji_dask.config import load_config
from tianji_dask.results.checkpoint import load_run_checkpoint
from tianji_dask.runtime.driver import train
from tianji_dask.runtime.training_evaluation import EVALUATOR_MODULE

EVALUATED = ["stop.target_return=null", "run.eval_every_env_steps=4000", "run.eval_episodes=4"]


def evaluators() -> list[psutil.Process]:
    return [
        p
        for p in psutil.Process().children(recursive=True)
        if EVALUATOR_MODULE in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE
    ]


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_each_evaluation_is_a_record_and_the_best_is_kept(tmp_path):
    cfg = load_config("configs/cartpole_dqn.yaml", [*EVALUATED, "stop.max_env_steps=16000"])
    result = train(cfg, serial=True, out=tmp_path / "run").wait()
    assert result.ok, result.error
    with xr.open_dataset(result.run_dir / "metrics.nc", engine="netcdf4") as ds:
        means, steps = ds["eval_return_mean"].values, ds["eval_env_steps"].values
        times = ds["eval_time"].values
    assert len(means) >= 2 and steps[0] >= 4000 and steps[-1] == result.env_steps, steps  # the last: the final
    assert np.all(np.diff(steps) > 0) and np.all(np.diff(times) > 0) and np.all(means >= 8), means
    best = json.loads((result.run_dir / "checkpoint_best" / "checkpoint.json").read_text())
    assert best["eval_return_mean"] == means.max() and best["eval_episodes"] == 4
    assert best["env_steps"] == steps[means.argmax()]  # the state that evaluation played
    load_run_checkpoint(result.run_dir, "dqn", "CartPole-v1", "checkpoint_best")  # whole, of this run
    assert evaluators() == []


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_a_run_whose_evaluator_dies_goes_on_without_evaluations(tmp_path):
    """Killed while the run trains (its budget far away: a run that reaches its stop while the
    evaluator, niced, answers its first evaluation would end before the kill), the evaluator's
    death is reported and the run goes on training until it is stopped."""
    cfg = load_config("configs/cartpole_dqn.yaml", [*EVALUATED, "stop.max_env_steps=2000000", "stop.max_seconds=150"])
    events: list[str] = []
    run = train(cfg, serial=True, out=tmp_path / "run", on_event=events.append)

    def noticed() -> bool:
        return any("the evaluator process ended" in e and "no more evaluations in this run" in e for e in events)

    assert wait_until(lambda: run.metrics().sizes["evaluation"] >= 1 or run.done, 120)
    assert not run.done and len(evaluators()) == 1
    evaluators()[0].kill()
    assert wait_until(lambda: noticed() or run.done, 60)
    assert noticed() and not run.done, events
    steps = run.recorder.tally.env_steps
    assert wait_until(lambda: run.recorder.tally.env_steps >= steps + 2 * cfg.run.eval_every_env_steps or run.done, 60)
    run.stop()
    result = run.wait()
    assert result.error is None and result.status == "stopped", (result.status, result.error)
    with xr.open_dataset(result.run_dir / "metrics.nc", engine="netcdf4") as ds:
        assert ds.sizes["evaluation"] <= 2  # the one before the kill, and at most one that ended with it
        # that one was asked for at the latest at the step count read once the death was noticed
        assert ds["eval_env_steps"].values.max() <= steps
    deadline = time.monotonic() + 10
    while evaluators() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert evaluators() == []


EVAL_LINE = re.compile(r"^eval at ([\d,]+) env steps: return -?[\d.]+ ± [\d.]+ over 40 episodes( \(best so far\))?")
SKIPPED = re.compile(r"; (\d+) skipped: an evaluation was still running$")


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_each_evaluation_is_a_line_and_those_skipped_while_one_played_are_counted(tmp_path):
    """A distributed run whose evaluations (40 episodes each) take longer than the run needs for
    the next 1,000 env steps: each evaluation made is a line of the run's events, with the
    evaluations that fell due while it played and were skipped; their count is metrics.nc's
    ``eval_skipped``. The run's internal notes (the first learner snapshot kept: run.snapshot_interval)
    are no line of its events."""
    cfg = load_config(
        "configs/cartpole_dqn.yaml",
        [*EVALUATED[:1], "stop.max_env_steps=null", "stop.max_seconds=20", "algo.learning_starts=500"]
        + ["run.eval_every_env_steps=1000", "run.eval_episodes=40", "run.snapshot_interval=1"],
    )
    events: list[str] = []
    result = train(cfg, out=tmp_path / "run", on_event=events.append).wait()
    assert result.ok, result.error
    with xr.open_dataset(result.run_dir / "metrics.nc", engine="netcdf4") as ds:
        steps = [int(s) for s in ds["eval_env_steps"].values]
        skipped = ds.attrs["eval_skipped"]
    lines = [e for e in events if e.startswith("eval at ")]
    assert [int(EVAL_LINE.match(e).group(1).replace(",", "")) for e in lines] == steps, lines  # type: ignore[union-attr]
    assert "(best so far)" in lines[0], lines
    said = [int(m.group(1)) for e in lines if (m := SKIPPED.search(e))]
    assert skipped > 0 and sum(said) == skipped, (skipped, lines)
    assert not [e for e in events if "snapshot" in e or "can now be restored" in e], events
    assert evaluators() == []
