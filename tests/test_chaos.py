"""benchmarks/chaos.py, small: one seed of DQN CartPole to a low target, calm and with one
worker killed within its first 2 s of production (one kill: a worker killed again while its
nanny still restarts it may not come back, see the closing notes), its main called from another
directory (its refusal runs it as a script); both runs reach the target and the chaos run's kill
and re-created hosts are in its files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import xarray as xr

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "chaos.py"


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_chaos_kills_workers_and_both_runs_reach_the_target(h, tmp_path):
    out = tmp_path / "chaos"
    args = ["--algos", "dqn", "--seeds", "0", "--target", "100", "--interval", "2", "--kills", "1"]
    done = h.called_here(h.script_main(SCRIPT), *args, "--max-seconds", "150", "--out", out, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "chaos.json").read_text())
    runs = {r["mode"]: r for r in report["runs"]}
    assert runs["calm"]["kills"] == 0 and runs["calm"]["actor_restarts"] == 0
    chaos = runs["chaos"]
    assert chaos["kills"] == 1, chaos
    first_kill_s = float(chaos["killed"][0].split("s ")[0])
    if first_kill_s + 2 < chaos["time_to_target_s"]:  # noticed (within a second) before the end
        assert chaos["actor_restarts"] + chaos["learner_restarts"] >= 1, chaos
    assert report["summary"]["dqn"]["ratio"] > 0
    with xr.open_dataset(out / "chaos.nc", engine="netcdf4") as ds:
        assert float(ds.kills.sel(algo="dqn", mode="chaos", seed=0)) == chaos["kills"]
    assert "dqn: median time to target calm" in done.stdout


def test_chaos_refuses_a_non_positive_interval(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--interval", "0", "--out", str(tmp_path / "c")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--interval must be positive" in done.stderr, done.stderr
    assert not (tmp_path / "c").exists()
