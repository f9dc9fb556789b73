"""benchmarks/mujoco_1m.py: bad input refused before any run; a short run of it writes the
per-env summary the MuJoCo issue asks for, its NetCDF and its figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import xarray as xr
from conftest import needs_mujoco, script_module

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "mujoco_1m.py"
mujoco_1m = script_module(SCRIPT)


def test_an_env_it_has_no_reference_for_is_refused_before_any_run(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        mujoco_1m.main(["--envs", "Ant-v5", "--out", str(tmp_path / "out")])
    assert stop.value.code == 2
    assert "--envs Ant-v5: not one of HalfCheetah-v5, Hopper-v5, Walker2d-v5" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_sb3_without_its_interpreter_is_refused_with_the_commands_that_make_one(tmp_path, capsys):
    missing = tmp_path / "nowhere" / "python"
    with pytest.raises(SystemExit) as stop:
        mujoco_1m.main(["--sb3", "--sb3-python", str(missing), "--out", str(tmp_path / "out")])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert f"--sb3-python {missing}: not found" in err and "pip install torch==2.13.0 stable-baselines3" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(180)
@needs_mujoco
def test_a_short_run_writes_the_summary_per_env_the_netcdf_and_the_figure(tmp_path):
    out = tmp_path / "out"
    argv = ["configs/halfcheetah_ppo.yaml", "--envs", "Hopper-v5", "--seeds", "3", "--env-steps", "4000"]
    assert mujoco_1m.main([*argv, "--out", str(out), "--runs", str(tmp_path / "runs")]) == 0
    summary = json.loads((out / "summary.json").read_text())
    hopper = summary["Hopper-v5"]
    assert hopper["seeds"] == [3] and hopper["cleanrl_return"] == 2382.86
    assert hopper["median_return"] == hopper["returns"][0] and hopper["median_wall_s"] > 0
    assert "stable_baselines3" not in hopper
    with xr.open_dataset(out / "mujoco_1m.nc", engine="netcdf4") as ds:
        assert dict(ds.sizes) == {"system": 2, "env": 1, "seed": 1}
        assert float(ds.env_steps.sel(system="tianji", env="Hopper-v5", seed=3)) >= 4000
        assert ds.wall_s.sel(system="sb3").isnull().all()
    assert (out / "mujoco_1m.png").stat().st_size > 10_000
