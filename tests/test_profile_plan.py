"""tianji-dask profile and plan on this machine: a real profile on a LocalCluster, a plan from
it, train --plan, and the refusals."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch
import xarray as xr
from conftest import CONFIG, SHORT, cli_here

from tianji_dask.deploy.planner import load_plan

pytestmark = pytest.mark.integration
CUDA = torch.cuda.is_available()


def cli(*args, timeout=300, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "tianji_dask.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """A profile written where ``tianji-dask profile`` puts it without --out."""
    cwd = tmp_path_factory.mktemp("profile")
    r = cli_here("profile", CONFIG, "--seconds", "0.5", "--batch-sizes", "64,128", cwd=cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    default = Path("runs") / "profiles" / f"cartpole_dqn-{len(os.sched_getaffinity(0))}cores.nc"
    assert f"profile: {default}" in r.stderr and sorted(p.name for p in cwd.iterdir()) == ["runs"]
    return cwd / default, r


def test_profile_writes_the_documented_dataset(measured):
    path, r = measured
    with xr.open_dataset(path, engine="netcdf4") as ds:
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
    r = cli_here("plan", CONFIG, "--cores", "2", "--profile", path, "--out", tmp_path / "plan.yaml")
    assert r.returncode == 0, r.stderr
    assert "bottleneck" in r.stdout and "another core" in r.stdout
    # off a terminal a line is never wrapped: the command it suggests can be pasted
    out = tmp_path / "plan.yaml"
    assert f"plan: {out}  (tianji-dask train {CONFIG} --plan {out})" in r.stdout.splitlines(), r.stdout
    plan = load_plan(tmp_path / "plan.yaml")
    assert plan.cores_used == 2 and plan.groups == 1 and plan.actors + plan.learner_threads == 2
    run = cli_here(
        "train",
        CONFIG,
        "--plan",
        tmp_path / "plan.yaml",
        "--out",
        tmp_path / "run",
        "--set",
        "stop.target_return=null",
        "--set",
        "stop.max_env_steps=3000",
        "--set",
        "algo.learning_starts=500",
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "warning" not in run.stderr
    saved = (tmp_path / "run" / "config.yaml").read_text()
    assert f"learner_threads: {plan.learner_threads}" in saved and f"batch_size: {plan.batch_size}" in saved
    # what the plan predicted, beside what the run measured
    with xr.open_dataset(tmp_path / "run" / "metrics.nc") as ds:
        attrs = dict(ds.attrs)
        measured_fps = float(ds.env_fps.max())
    assert attrs["plan_actor_env_steps_per_s"] == pytest.approx(plan.predicted["actor_env_steps_per_s"])
    assert attrs["plan_train_samples_per_s"] == pytest.approx(plan.predicted["train_samples_per_s"])
    assert attrs["plan_replay_ratio"] == plan.replay_ratio and attrs["plan_bottleneck"] == plan.bottleneck
    assert measured_fps > 0


def test_plan_refusals(measured, tmp_path):
    """The first refusal as a process of its own (its exit status); the rest in this process."""
    path, _ = measured
    r = cli("plan", CONFIG, "--cores", "1", "--profile", path, "--out", tmp_path / "p.yaml")
    assert r.returncode == 2 and "1 actor core + 1 learner core = 2 cores" in r.stderr
    r = cli_here(
        "plan",
        CONFIG,
        "--cores",
        "2",
        "--profile",
        path,
        "--memory-per-node",
        "1GiB",
        "--out",
        tmp_path / "p.yaml",
    )
    assert r.returncode == 2 and "no allocation fits in memory" in r.stderr and "GiB" in r.stderr
    r = cli_here(
        "plan",
        CONFIG.parent / "cartpole_ppo.yaml",
        "--cores",
        "2",
        "--profile",
        path,
        "--out",
        tmp_path / "p.yaml",
    )
    assert r.returncode == 2 and "measured dqn on CartPole-v1, the config is ppo" in r.stderr
    assert not (tmp_path / "p.yaml").exists()
    r = cli_here("train", CONFIG, "--plan", tmp_path / "missing.yaml")
    assert r.returncode == 2 and "no such file" in r.stderr
    (tmp_path / "notes.txt").write_text("not a profile")
    r = cli_here("plan", CONFIG, "--cores", "2", "--profile", tmp_path / "notes.txt", "--out", tmp_path / "p.yaml")
    assert r.returncode == 2 and "is not a NetCDF file" in r.stderr and "tianji-dask profile CONFIG" in r.stderr
    xr.Dataset({"x": ("t", [1.0])}).to_netcdf(tmp_path / "other.nc", engine="netcdf4")
    r = cli_here("plan", CONFIG, "--cores", "2", "--profile", tmp_path / "other.nc", "--out", tmp_path / "p.yaml")
    assert r.returncode == 2 and "is not a tianji-dask profile (no actor_env_steps_per_s" in r.stderr
    for bad, message in (
        (["--max-actors", "0"], "--max-actors must be at least 1"),
        (["--seconds", "0"], "--seconds must be positive"),
        (["--batch-sizes", "64,x"], "--batch-sizes takes comma-separated positive integers"),
    ):
        r = cli_here("profile", CONFIG, *bad, "--out", tmp_path / "prof.nc")
        assert r.returncode == 2 and message in r.stderr, r.stderr
    assert not (tmp_path / "p.yaml").exists() and not (tmp_path / "prof.nc").exists()
    # what is already written is never replaced
    (tmp_path / "kept.yaml").write_text("mine")
    r = cli_here("plan", CONFIG, "--cores", "2", "--profile", path, "--out", tmp_path / "kept.yaml")
    assert r.returncode == 2 and "exists" in r.stderr and (tmp_path / "kept.yaml").read_text() == "mine"
    before = path.read_bytes()
    r = cli_here("profile", CONFIG, "--out", path)
    assert r.returncode == 2 and "holds a profile already written" in r.stderr and path.read_bytes() == before


def make_plan_file(profile, path, cores: int, *overrides: str):
    sets = [arg for o in overrides for arg in ("--set", o)]
    r = cli_here("plan", CONFIG, "--cores", cores, "--profile", profile, "--out", path, *sets)
    assert r.returncode == 0, r.stderr
    return load_plan(path)


def test_a_plan_for_more_cores_than_this_process_may_use_warns_and_runs(measured, tmp_path):
    cores = len(os.sched_getaffinity(0))
    plan = make_plan_file(measured[0], tmp_path / "plan.yaml", cores + 1)
    assert plan.cores_used > cores
    run = cli_here(
        "train",
        CONFIG,
        "--plan",
        tmp_path / "plan.yaml",
        "--out",
        tmp_path / "run",
        *[arg for o in (*SHORT, "stop.max_env_steps=3000") for arg in ("--set", o)],
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert (
        f"warning: the plan {tmp_path / 'plan.yaml'} uses {plan.cores_used} cores, more than the {cores} "
        f"cores this process may use on this machine (os.sched_getaffinity)"
    ) in run.stderr, run.stderr
    assert f"tianji-dask plan {CONFIG} --cores {cores}" in run.stderr


def test_a_plan_needing_more_memory_than_this_machine_is_refused(measured, tmp_path):
    with xr.open_dataset(measured[0], engine="netcdf4") as ds:
        per_transition = float(ds.replay_bytes_per_transition)
    total = psutil.virtual_memory().total
    make_plan_file(measured[0], tmp_path / "plan.yaml", 2, f"algo.buffer_size={int(2 * total / per_transition)}")
    run = cli_here("train", CONFIG, "--plan", tmp_path / "plan.yaml", "--out", tmp_path / "run")
    assert run.returncode == 2, run.stderr[-3000:]
    assert f"more than the {total / 2**30:.2f} GiB of this machine" in run.stderr, run.stderr
    assert f"--memory-per-node {total // 2**30}GiB" in run.stderr
    assert not (tmp_path / "run").exists()


def test_a_plan_larger_than_the_schedulers_cluster_is_named_with_its_numbers(measured, tmp_path):
    from distributed import LocalCluster

    make_plan_file(measured[0], tmp_path / "plan.yaml", 2)
    with LocalCluster(
        n_workers=1,
        threads_per_worker=1,
        processes=False,
        protocol="tcp://",
        host="127.0.0.1",
        memory_limit="1GiB",
        dashboard_address="127.0.0.1:0",
    ) as cluster:
        address = cluster.scheduler_address
        run = cli_here(
            "train", CONFIG, "--plan", tmp_path / "plan.yaml", "--scheduler", address, "--out", tmp_path / "run"
        )
    assert run.returncode == 2, run.stderr[-3000:]
    assert f"uses 2 cores, more than the 1 worker threads of the cluster at {address}" in run.stderr, run.stderr
    assert f"more than the 1.00 GiB of the cluster at {address}" in run.stderr
    assert not (tmp_path / "run").exists()


def test_plan_writes_under_runs_plans_beside_its_profile_and_never_replaces_it(measured, tmp_path):
    plan, profile = Path("runs/plans/cartpole_dqn-2cores.yaml"), Path("runs/plans/cartpole_dqn-2cores.profile.nc")
    (tmp_path / profile).parent.mkdir(parents=True)
    shutil.copy(measured[0], tmp_path / profile)
    r = cli_here("plan", CONFIG, "--cores", "2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"planning from the profile {profile}" in r.stderr and "measuring" not in r.stderr
    assert f"plan: {plan}" in r.stdout and load_plan(tmp_path / plan).cores_used == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]
    written = (tmp_path / plan).read_bytes()
    r = cli_here("plan", CONFIG, "--cores", "2", cwd=tmp_path)
    assert r.returncode == 2 and f"{plan} exists; it holds a plan already written" in r.stderr, r.stderr
    assert (tmp_path / plan).read_bytes() == written


@pytest.mark.skipif(CUDA, reason="this machine has a GPU: the refusal needs one without")
def test_gpu_measurements_without_a_gpu_are_refused_before_any_is_written(measured, tmp_path):
    r = cli_here("profile", CONFIG, "--gpu", "--seconds", "0.5", "--out", tmp_path / "prof.nc")
    assert r.returncode == 2 and "sees no CUDA device" in r.stderr and "without --gpu" in r.stderr, r.stderr
    assert "TR_A" not in r.stderr  # refused before the first measurement
    path, _ = measured  # measured without --gpu
    r = cli_here("plan", CONFIG, "--cores", "2", "--gpus", "1", "--profile", path, "--out", tmp_path / "p.yaml")
    assert r.returncode == 2 and "no GPU measurements" in r.stderr and "--gpu" in r.stderr, r.stderr
    assert not (tmp_path / "prof.nc").exists() and not (tmp_path / "p.yaml").exists()


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_a_profile_on_the_gpu_measures_the_learner_and_the_actor_there_and_plans_with_them(tmp_path):
    small = CONFIG.parent / "pong_ppo_small.yaml"
    cores = len(os.sched_getaffinity(0))
    r = cli_here(
        "plan", small, "--cores", cores, "--gpus", "1", "--seconds", "1", "--max-actors", "2",
        "--max-threads", "1", "--out", tmp_path / "plan.yaml", timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    with xr.open_dataset(tmp_path / "plan.profile.nc", engine="netcdf4") as ds:
        assert (ds.gpu_learner_samples_per_s > 0).all() and (ds.gpu_actor_env_steps_per_s > 0).all()
        assert int(ds.env_threads.max()) == min(cores - 1, 4)  # at most one thread per env
        assert ds.attrs["gpu"] != "none"
    plan = load_plan(tmp_path / "plan.yaml")
    assert plan.learner_device == "cuda" and plan.gpus_used == 1
