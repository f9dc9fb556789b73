"""benchmarks/time_to_target.py: a real run on a LocalCluster lands in its JSON and NetCDF, and
the run's own event lines (the hosts' start-up) are printed timed from its start."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import xarray as xr

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "time_to_target.py"


@pytest.mark.integration
def test_a_run_lands_in_the_results_with_its_start_up_lines(h, tmp_path):
    args = ["configs/cartpole_ppo.yaml", "--modes", "distributed", "--seeds", "3"]
    args += ["--set", "stop.target_return=40", "--set", "stop.max_env_steps=200000", "--set", "run.checkpoint=false"]
    args += ["--out", tmp_path / "out", "--runs", tmp_path / "runs"]
    r = h.called_here(h.script_main(SCRIPT), *args, cwd=ROOT)  # its main, in this process
    assert r.returncode == 0, r.stderr[-3000:]
    ready = re.search(r"distributed seed 3: +([0-9.]+) s  hosts ready \(the slowest of each role\): ", r.stdout)
    assert ready, r.stdout[-3000:]
    run = json.loads((tmp_path / "out" / "time_to_target.json").read_text())["runs"][0]
    assert run["status"] == "target_reached" and 0 < run["env_steps_to_target"] <= run["env_steps"]
    assert 0 < float(ready.group(1)) < run["time_to_target_s"] <= run["wall_s"]
    ds = xr.open_dataset(tmp_path / "out" / "time_to_target.nc", engine="netcdf4")
    assert dict(ds.sizes) == {"mode": 1, "seed": 1}
    assert float(ds.time_to_target_s.sel(mode="distributed", seed=3)) == pytest.approx(run["time_to_target_s"])
