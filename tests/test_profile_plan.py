"""tianji-dask profile and plan on this machine: a real profile on a LocalCluster, a plan from
it, train --plan, and the refusals."""

from __future__ import annotations

import subprocess
import sys

import pytest
import xarray as xr

from tianji_dask.planner import load_plan

from conftest import CONFIG

pytestmark = pytest.mark.integration


def cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "tianji_dask.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    path = tmp_path_factory.mktemp("profile") / "profile.nc"
    r = cli("profile", CONFIG, "--seconds", "0.5", "--batch-sizes", "64,128", "--out", path)
    assert r.returncode == 0, r.stderr[-3000:]
    return path, r


def test_profile_writes_the_documented_dataset(measured):
    path, r = measured
    with xr.open_dataset(path, engine="h5netcdf") as ds:
        assert list(ds.actors.values) == [1, 2]
        assert list(ds.batch_size.values) == [64, 128]
        assert ds.learner_samples_per_s.dims == ("threads", "batch_size")
        assert (ds.actor_env_steps_per_s > 0).all() and (ds.learner_samples_per_s > 0).all()
        assert 1_000 < int(ds.message_bytes) < 100_000  # 256 CartPole transitions
        assert float(ds.replay_bytes_per_transition) == pytest.approx(4 * 4 * 2 + 8 + 4 + 4)
        for name, var in ds.variables.items():
            assert var.attrs.get("long_name") and var.attrs.get("units"), name
        assert ds.attrs["algo"] == "dqn" and ds.attrs["replay_ratio"] == 8
    assert "TR_A(1 actors)" in r.stdout


def test_plan_from_a_saved_profile_and_train_with_it(measured, tmp_path):
    path, _ = measured
    r = cli("plan", CONFIG, "--cores", "2", "--profile", path, "--out", tmp_path / "plan.yaml")
    assert r.returncode == 0, r.stderr
    assert "bottleneck" in r.stdout and "another core" in r.stdout
    plan = load_plan(tmp_path / "plan.yaml")
    assert plan.cores_used == 2 and plan.groups == 1 and plan.actors + plan.learner_threads == 2
    run = cli("train", CONFIG, "--plan", tmp_path / "plan.yaml", "--out", tmp_path / "run",
              "--set", "stop.target_return=null", "--set", "stop.max_seconds=6", "--set", "algo.learning_starts=500")
    assert run.returncode == 0, run.stderr[-3000:]
    saved = (tmp_path / "run" / "config.yaml").read_text()
    assert f"learner_threads: {plan.learner_threads}" in saved and f"batch_size: {plan.batch_size}" in saved


def test_plan_refusals(measured, tmp_path):
    path, _ = measured
    r = cli("plan", CONFIG, "--cores", "1", "--profile", path, "--out", tmp_path / "p.yaml")
    assert r.returncode == 2 and "1 actor core + 1 learner core = 2 cores" in r.stderr
    r = cli("plan", CONFIG, "--cores", "2", "--profile", path, "--memory-per-node", "1GiB", "--out", tmp_path / "p.yaml")
    assert r.returncode == 2 and "no allocation fits in memory" in r.stderr and "GiB" in r.stderr
    r = cli("plan", CONFIG.parent / "cartpole_ppo.yaml", "--cores", "2", "--profile", path, "--out", tmp_path / "p.yaml")
    assert r.returncode == 2 and "measured dqn on CartPole-v1, the config is ppo" in r.stderr
    assert not (tmp_path / "p.yaml").exists()
    r = cli("train", CONFIG, "--plan", tmp_path / "missing.yaml")
    assert r.returncode == 2 and "no such file" in r.stderr
    (tmp_path / "notes.txt").write_text("not a profile")
    r = cli("plan", CONFIG, "--cores", "2", "--profile", tmp_path / "notes.txt", "--out", tmp_path / "p.yaml")
    assert r.returncode == 2 and "is not a NetCDF file" in r.stderr and "tianji-dask profile CONFIG" in r.stderr
    xr.Dataset({"x": ("t", [1.0])}).to_netcdf(tmp_path / "other.nc", engine="h5netcdf")
    r = cli("plan", CONFIG, "--cores", "2", "--profile", tmp_path / "other.nc", "--out", tmp_path / "p.yaml")
    assert r.returncode == 2 and "is not a tianji-dask profile (no actor_env_steps_per_s" in r.stderr
    for bad, message in ((["--max-actors", "0"], "--max-actors must be at least 1"),
                         (["--seconds", "0"], "--seconds must be positive"),
                         (["--batch-sizes", "64,x"], "--batch-sizes takes comma-separated positive integers")):
        r = cli("profile", CONFIG, *bad, "--out", tmp_path / "prof.nc")
        assert r.returncode == 2 and message in r.stderr, r.stderr
    assert not (tmp_path / "p.yaml").exists() and not (tmp_path / "prof.nc").exists()
    # what is already written is never replaced
    (tmp_path / "kept.yaml").write_text("mine")
    r = cli("plan", CONFIG, "--cores", "2", "--profile", path, "--out", tmp_path / "kept.yaml")
    assert r.returncode == 2 and "exists" in r.stderr and (tmp_path / "kept.yaml").read_text() == "mine"
    before = path.read_bytes()
    r = cli("profile", CONFIG, "--out", path)
    assert r.returncode == 2 and "holds a profile already written" in r.stderr and path.read_bytes() == before
