"""benchmarks/pong_summary.py on committed Pong runs (tests/data/pong_runs/): its figures agree with what the recorder
wrote during each run, the budget bounds what counts, and bad input is refused with the fix."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

pytestmark = pytest.mark.slow  # subprocesses of the summary script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "pong_summary.py"
RUNS = ROOT / "tests" / "data" / "pong_runs"
PPO = ["pong_ppo_16core_gpu", "pong_ppo_16core_gpu_seed1", "pong_ppo_16core_gpu_seed2"]
DQN = "pong_dqn_16core_gpu_30min"


def summary(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Copies of the committed runs (``--run-pngs`` writes into the run directories)."""
    root = tmp_path_factory.mktemp("pong")
    for name in [*PPO, DQN]:
        shutil.copytree(RUNS / name, root / name, ignore=shutil.ignore_patterns("*.png"))
    return root


def test_figures_agree_with_the_recorder(runs, tmp_path):
    r = summary("--ppo", *(str(runs / p) for p in PPO), "--dqn", str(runs / DQN), "--out", str(tmp_path), "--run-pngs")
    assert r.returncode == 0, r.stderr
    out = json.loads((tmp_path / "pong_summary.json").read_text())
    by_dir = {s["dir"]: s for s in out["runs"]}
    for name in PPO:
        with xr.open_dataset(runs / name / "metrics.nc", engine="netcdf4") as ds:
            recorded = float(ds.attrs["time_to_target_s"])
        assert by_dir[name]["time_to_target_s"] == pytest.approx(recorded, abs=0.01)
    times = sorted(by_dir[p]["time_to_target_s"] for p in PPO)
    assert out["ppo"]["median_time_to_target_s"] == times[1]
    assert out["ppo"]["reached_target"] == 3

    with xr.open_dataset(runs / DQN / "metrics.nc", engine="netcdf4") as ds:
        best = float(ds["return_mean_100"].max())
        assert np.isnan(float(ds.attrs["time_to_target_s"]))
    dqn = by_dir[DQN]
    assert dqn["time_to_target_s"] is None
    assert dqn["best_return_mean_100"] == pytest.approx(best, abs=1e-3)
    assert out["dqn"]["median_best_return_mean_100"] == dqn["best_return_mean_100"]
    # the run that missed counts as the budget, a lower bound
    assert out["dqn"]["median_time_to_target_s"] == 1800 and out["dqn"]["median_is_lower_bound"]
    assert not out["ppo"]["median_is_lower_bound"]
    assert "dqn: median time to 18: at least 1800.0 s (0 of 1 runs reached it" in r.stdout
    assert "ppo: median time to 18" in r.stdout
    for png in [tmp_path / "pong_summary.png", *(runs / n / "return.png" for n in [*PPO, DQN])]:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png


def test_a_run_that_records_received_reports_its_replay_ratio_windows(tmp_path):
    """A run recorded with ``received`` (issue 30's race) gets the least and the most replay
    ratio of its 10-s windows (``ds.tianji.replay_ratio``); older runs, without it, get neither."""
    from tianji_dask.results.analysis import open_run

    run = RUNS / "dqn_h200_seed53"
    r = summary("--dqn", str(run), "--budget", "300", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    rates = json.loads((tmp_path / "pong_summary.json").read_text())["runs"][0]["median_throughput"]
    windows = open_run(run).tianji.replay_ratio(10.0)
    assert rates["replay_ratio_10s_min"] == pytest.approx(float(windows.min()), abs=1e-3)
    assert rates["replay_ratio_10s_max"] == pytest.approx(float(windows.max()), abs=1e-3)
    assert 32 * 0.9 < rates["replay_ratio_10s_min"] <= rates["replay_ratio_10s_max"] < 32 * 1.1


def test_the_budget_bounds_what_counts(runs, tmp_path):
    budget = 240.0
    r = summary("--ppo", *(str(runs / p) for p in PPO), "--budget", str(budget), "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    out = json.loads((tmp_path / "pong_summary.json").read_text())
    for s in out["runs"]:
        if s["time_to_target_s"] is None:
            assert s["best_at_s"] <= budget and s["best_return_mean_100"] < 18
        else:
            assert s["time_to_target_s"] <= budget
    # seed 0 took 320 s: outside a 240-s budget; seed 2 took 222 s: inside
    by_dir = {s["dir"]: s for s in out["runs"]}
    assert by_dir["pong_ppo_16core_gpu"]["time_to_target_s"] is None
    assert by_dir["pong_ppo_16core_gpu_seed2"]["time_to_target_s"] is not None


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "no runs: pass run directories with --ppo and/or --dqn"),
        (["--dqn", str(RUNS / PPO[0])], "is a ppo run, passed as --dqn; pass it with --ppo"),
        (["--ppo", str(RUNS / "no_such_run")], "no_such_run"),
        (["--ppo", str(RUNS / PPO[0]), "--budget", "0"], "--budget 0: must be positive"),
    ],
)
def test_bad_input_is_refused_with_the_fix(h, tmp_path, args, message):
    # the first refusal as the script's own process (its exit status), the rest called here
    run = summary if not args else lambda *a: h.called_here(h.script_main(SCRIPT), *a, cwd=ROOT)
    r = run(*args, "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert not (tmp_path / "out" / "pong_summary.json").exists()
