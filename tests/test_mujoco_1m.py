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


def _saved_runs(path: Path, env_id: str, seeds: list[int], created: str) -> Path:
    """A mujoco_1m.json as one invocation writes it, with a run per seed."""
    runs = [
        {
            "system": "tianji",
            "env": env_id,
            "seed": seed,
            "status": "max_env_steps",
            "error": None,
            "return_mean_100": 1000.0 + 100 * seed,
            "wall_s": 140.0 + seed,
            "env_steps": 1_000_000 + seed,
            "env_steps_per_s": 7000.0,
            "samples": 999_424.0,
            "stale_dropped": 2048.0,
            "load_avg_1m": 5.0,
            "curve": {"time": [1.0, 2.0], "env_steps": [2048, 4096], "return": [-10.0, 5.0 + seed]},
        }
        for seed in seeds
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": {"created": created, "machine": "16 cores"}, "runs": runs}))
    return path


def test_merge_writes_the_runs_of_several_invocations_together(tmp_path):
    """A measurement split over two leases: HalfCheetah seed 0 in one, seeds 1-2 and Hopper seed 0
    in the other; the merged summary holds the medians over all of them, the NetCDF every run, and
    each part's metadata."""
    first = _saved_runs(tmp_path / "a" / "mujoco_1m.json", "HalfCheetah-v5", [0], "first")
    second = _saved_runs(tmp_path / "b" / "mujoco_1m.json", "HalfCheetah-v5", [2, 1], "second")
    third = _saved_runs(tmp_path / "c" / "mujoco_1m.json", "Hopper-v5", [0], "second")
    out = tmp_path / "merged"
    assert mujoco_1m.main(["--merge", str(third), str(first), str(second), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary) == ["HalfCheetah-v5", "Hopper-v5"]
    cheetah = summary["HalfCheetah-v5"]
    assert cheetah["seeds"] == [0, 1, 2] and cheetah["median_return"] == 1100.0 and cheetah["median_wall_s"] == 141.0
    assert summary["Hopper-v5"]["seeds"] == [0]
    saved = json.loads((out / "mujoco_1m.json").read_text())
    assert [m["created"] for m in saved["meta"]["merged_from"]] == ["second", "first", "second"]
    with xr.open_dataset(out / "mujoco_1m.nc", engine="netcdf4") as ds:
        assert dict(ds.sizes) == {"system": 2, "env": 2, "seed": 3}
        assert float(ds.return_mean_100.sel(system="tianji", env="HalfCheetah-v5", seed=2)) == 1200.0
        assert ds.return_mean_100.sel(system="tianji", env="Hopper-v5", seed=2).isnull()
    assert (out / "mujoco_1m.png").stat().st_size > 10_000


def test_merge_refuses_a_run_in_two_parts_and_a_file_it_did_not_write(tmp_path, capsys):
    first = _saved_runs(tmp_path / "a" / "mujoco_1m.json", "HalfCheetah-v5", [0, 1], "first")
    second = _saved_runs(tmp_path / "b" / "mujoco_1m.json", "HalfCheetah-v5", [1], "second")
    with pytest.raises(SystemExit) as stop:
        mujoco_1m.main(["--merge", str(first), str(second), "--out", str(tmp_path / "out")])
    assert stop.value.code == 2
    assert "tianji HalfCheetah-v5 seed 1 is in more than one part" in capsys.readouterr().err
    other = tmp_path / "other.json"
    other.write_text("[1, 2]")
    with pytest.raises(SystemExit):
        mujoco_1m.main(["--merge", str(other), "--out", str(tmp_path / "out")])
    assert f"--merge {other}: not a mujoco_1m.json this script wrote" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
