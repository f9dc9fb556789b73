"""Runs on Slurm jobs sized by a plan, against the real local Slurm (jobqueue/local-slurm.sh).

Skipped without one; failed without one when TIANJI_REQUIRE_SLURM=1 (CI)."""

from __future__ import annotations

import subprocess
import sys
import time

import cloudpickle
import pytest
from conftest import CONFIG, SHORT, check_run_dir, wait_until
from conftest import ending as h_ending
from slurm_support import fake_command, six_core_plan, two_core_plan

from tianji_dask.config import load_config
from tianji_dask.deploy.planner import Job, PlanError
from tianji_dask.deploy.slurm import check_fits, job_scripts, planned_processes
from tianji_dask.runtime.cluster.workers import scheduler_workers

pytestmark = [pytest.mark.slurm, pytest.mark.integration]
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def squeue() -> list[tuple[str, str]]:
    r = subprocess.run(["squeue", "-h", "-o", "%A %j"], capture_output=True, text=True, timeout=15)
    assert r.returncode == 0, r.stderr
    return [tuple(line.split(maxsplit=1)) for line in r.stdout.splitlines()]


def wait_empty(timeout=30.0):
    deadline = time.monotonic() + timeout
    while (q := squeue()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return q


def site(tmp_path):
    return dict(
        walltime="00:10:00",
        interface="lo",
        log_directory=str(tmp_path / "logs"),
        local_directory=str(tmp_path / "scratch"),
        death_timeout=30,
        scheduler_options={"dashboard_address": "127.0.0.1:0"},
    )


def test_job_scripts_carry_the_plans_cores_and_memory(jobqueue_defaults):
    plan = six_core_plan(load_config(CONFIG, [*SHORT]))
    scripts = dict(job_scripts(plan, walltime="00:07:00"))
    learner = scripts["tianji-run-g0-learner"]
    actors = scripts["tianji-run-g0-actors"]
    assert "#SBATCH --cpus-per-task=2" in learner and "#SBATCH --cpus-per-task=4" in actors
    from dask_jobqueue.slurm import slurm_format_bytes_ceil  # Slurm's --mem, rounded up as sbatch takes it

    mem = {j.kind: slurm_format_bytes_ceil(j.memory_bytes) for j in plan.jobs}
    assert f"#SBATCH --mem={mem['learner']}" in learner, learner
    assert f"#SBATCH --mem={mem['actors']}" in actors, actors
    assert plan.jobs[1].memory_bytes == 4 * plan.jobs[1].memory_bytes // 4 > 4 * 500 * 2**20
    assert "--nworkers 4" in actors and "--resources tianji_actor=1,tianji_group_0=1" in actors
    assert "--resources tianji_learner=1,tianji_group_0=1" in learner
    assert "#SBATCH -t 00:07:00" in learner
    # the CLI shows the same scripts
    out = subprocess.run(
        [sys.executable, "-m", "tianji_dask.cli", "job-script", str(CONFIG), "--walltime", "00:07:00"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("#!/usr/bin/env bash") == 2 and "--cpus-per-task=1" in out.stdout


def test_an_oversized_plan_is_refused_before_submission(slurm_conf, jobqueue_defaults, tmp_path):
    from tianji_dask.deploy.slurm_cluster import PlannedSLURMCluster

    cfg = load_config(CONFIG, [*SHORT])
    plan = two_core_plan(cfg)
    plan.jobs[0] = Job("learner", 0, 64, 1, 2**30, 0)
    before = squeue()
    with pytest.raises(
        PlanError,
        match=r"learner job needs 64 cores.*largest node of the default partition has "
        r"\d+ CPUs.*nothing was submitted",
    ):
        PlannedSLURMCluster(plan, **site(tmp_path))
    assert squeue() == before
    with pytest.raises(PlanError, match="nothing was submitted"):
        check_fits(plan)


def test_no_sbatch_is_refused_before_anything_starts(jobqueue_defaults, monkeypatch, tmp_path):
    from tianji_dask.deploy.slurm_cluster import PlannedSLURMCluster

    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch here
    plan = two_core_plan(load_config(CONFIG, [*SHORT]))
    with pytest.raises(PlanError, match="sbatch is not on PATH.*local-slurm.sh"):
        PlannedSLURMCluster(plan)


@pytest.mark.timeout(120)
def test_a_job_slurm_refuses_cancels_the_rest(slurm_conf, jobqueue_defaults, tmp_path, monkeypatch):
    """Past check_fits (a site whose sinfo misleads it), sbatch's own refusal surfaces as an error
    that quotes Slurm, and the plan's other job is not left queued."""
    from tianji_dask.deploy.slurm_cluster import PlannedSLURMCluster, SlurmSubmitError

    assert wait_empty() == []
    plan = two_core_plan(load_config(CONFIG, [*SHORT]))
    plan.jobs[1] = Job("actors", 0, 64, 1, 2**30, 0)
    fake_command(monkeypatch, tmp_path / "bin", "sinfo", 'echo "debug* 64 1000000"')
    with pytest.raises(SlurmSubmitError, match="More processors requested than permitted"):
        PlannedSLURMCluster(plan, **site(tmp_path))
    assert wait_empty() == []


@pytest.mark.timeout(240)
def test_a_planned_run_on_slurm_jobs_writes_its_results(slurm_conf, jobqueue_defaults, tmp_path):
    from distributed import Client

    from tianji_dask.deploy.slurm_cluster import PlannedSLURMCluster
    from tianji_dask.runtime.driver import train

    assert wait_empty() == [], "jobs left over from an earlier test"
    # stopped by env steps, not seconds: creating the hosts in fresh job processes takes a few
    # seconds, and a budget of seconds could end the run before its first update
    overrides = [*SHORT, "stop.max_env_steps=2000", "stop.max_seconds=90"]
    cfg = two_core_plan(load_config(CONFIG, overrides)).apply(load_config(CONFIG, overrides))
    plan = two_core_plan(cfg)
    cluster = PlannedSLURMCluster(plan, run_tag="t1", **site(tmp_path))
    try:
        with Client(cluster) as client:
            client.wait_for_workers(planned_processes(plan), timeout=90)
            names = sorted(name for _, name in squeue())
            assert names == ["tianji-t1-g0-actors", "tianji-t1-g0-learner"]
            resources = {w["name"]: w["resources"] for w in scheduler_workers(client).values()}
            assert resources == {
                "tianji-t1-g0-learner": {"tianji_learner": 1, "tianji_group_0": 1},
                "tianji-t1-g0-actors": {"tianji_actor": 1, "tianji_group_0": 1},
            }
            run = train(cfg, client, out=tmp_path / "run")
            deadline = time.monotonic() + 60
            while run.metrics().sizes.get("time", 0) < 1 and time.monotonic() < deadline:
                time.sleep(0.2)
            # the hosts went where the resources said
            held = client.run(
                lambda dask_worker: (
                    dask_worker.name,
                    sorted(type(a).__name__ for a in dask_worker.state.actors.values()),
                )
            )
            assert sorted(held.values()) == [
                ("tianji-t1-g0-actors", ["ActorHost"]),
                ("tianji-t1-g0-learner", ["BufferHost", "LearnerHost"]),
            ]
            result = run.wait()
            assert result.ok, result.error
        check_run_dir(tmp_path / "run", cfg, mode="distributed")
    finally:
        cluster.close()
    assert wait_empty() == [], "closing the cluster left jobs"


@pytest.mark.timeout(240)
def test_a_cancelled_slurm_job_is_reported_not_left_hanging(slurm_conf, jobqueue_defaults, tmp_path):
    from distributed import Client

    from tianji_dask.deploy.slurm_cluster import PlannedSLURMCluster
    from tianji_dask.runtime.driver import train

    assert wait_empty() == [], "jobs left over from an earlier test"
    cfg = load_config(CONFIG, [*SHORT, "stop.max_seconds=120", "run.heartbeat_timeout=5", "run.max_restarts=0"])
    plan = two_core_plan(cfg)
    cfg = plan.apply(cfg)
    cluster = PlannedSLURMCluster(plan, run_tag="t2", **site(tmp_path))
    try:
        with Client(cluster) as client:
            client.wait_for_workers(planned_processes(plan), timeout=90)
            run = train(cfg, client, out=tmp_path / "run")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # mid-run: the actor is producing
                ds = run.metrics()
                if "env_steps" in ds and ds.sizes.get("time", 0) and float(ds.env_steps.max()) > 0:
                    break
                time.sleep(0.2)
            assert float(run.metrics().env_steps.max()) > 0
            actors_job = [jid for jid, name in squeue() if name == "tianji-t2-g0-actors"]
            assert actors_job
            subprocess.run(["scancel", actors_job[0]], check=True, timeout=15)
            t_cancel = time.monotonic()
            result = run.wait()
            waited = time.monotonic() - t_cancel
            assert not result.ok and result.status == "failed"
            assert "actor 0" in result.error, result.error
            assert "its worker left the cluster" in result.error, result.error
            assert waited < 15, waited
            assert (tmp_path / "run" / "metrics.nc").exists()
    finally:
        cluster.close()
    assert wait_empty() == [], "closing the cluster left jobs"


def _story(run, events: list[str]) -> str:
    """Every event of the run and its actor's last rows, whole (pytest shortens a long list)."""
    ds = run.metrics()
    rows = ds[["actor_restarts", "actor_env_steps", "actor_param_version"]].isel(time=slice(-8, None))
    return "\n".join([*events, "last rows:", str(rows.to_dataframe())])


@pytest.mark.timeout(300)
def test_a_cancelled_slurm_job_is_submitted_again_and_the_run_goes_on_there(slurm_conf, jobqueue_defaults, tmp_path):
    """scancel of the actors' job mid-run: the cluster submits the job again (same name, size and
    tags), the actor host is re-created on its worker and produces there. No stop rule fires: a
    target could come before the cancelled job's worker is gone, and nothing would be re-created;
    the test stops the run once the new actor has stepped."""
    import numpy as np
    from distributed import Client

    from tianji_dask.deploy.slurm_cluster import PlannedSLURMCluster
    from tianji_dask.runtime.driver import train

    assert wait_empty() == [], "jobs left over from an earlier test"
    cfg = load_config(CONFIG, ["stop.target_return=null", "stop.max_env_steps=null", "stop.max_seconds=250"])
    plan = two_core_plan(cfg)
    cfg = plan.apply(cfg)
    cluster = PlannedSLURMCluster(plan, run_tag="t4", **site(tmp_path))
    events: list[str] = []

    def new_actor_steps() -> float:
        """The env steps the re-created actor made (0 before it exists): the growth of actor 0's
        count over the rows since its restart was counted (it goes on from its predecessor's
        count). No row need show the predecessor's steps: when the driver's rows lag, the loss
        can be counted before any row recorded them."""
        ds = run.metrics()
        if ds.sizes["time"] == 0 or int(ds.actor_restarts[-1]) < 1:
            return 0.0
        steps = ds.actor_env_steps.sel(actor=0).values[int(np.argmax(ds.actor_restarts.values > 0)) :]
        steps = steps[np.isfinite(steps)]
        return float(steps.max() - steps.min()) if len(steps) else 0.0

    try:
        with Client(cluster) as client:
            client.wait_for_workers(planned_processes(plan), timeout=90)
            run = train(cfg, client, out=tmp_path / "run", on_event=events.append)
            with h_ending(run):
                assert wait_until(lambda: run.recorder.tally.env_steps > 0 or run.done, 60), (run.result, events)
                assert not run.done, (run.result, events)
                first = dict((name, job) for job, name in squeue())
                subprocess.run(["scancel", first["tianji-t4-g0-actors"]], check=True, timeout=15)
                assert wait_until(lambda: new_actor_steps() > 1000 or run.done, 200), _story(run, events)
                run.stop()
                result = run.wait(timeout=60)
            assert result is not None and result.status == "stopped", (result, events)
            again = dict((name, job) for job, name in squeue())
            workers = {w["name"]: w["resources"] for w in scheduler_workers(client).values()}
        assert again["tianji-t4-g0-actors"] != first["tianji-t4-g0-actors"], (first, again)
        assert again["tianji-t4-g0-learner"] == first["tianji-t4-g0-learner"]
        assert workers["tianji-t4-g0-actors"] == {"tianji_actor": 1, "tianji_group_0": 1}
        assert "batch job tianji-t4-g0-actors ended: submitted it again" in events, events
        assert not any("share" in e for e in events), events  # the hosts went to the new job's worker
        ds = run.metrics()
        assert int(ds.actor_restarts[-1]) == 1 and int(ds.learner_restarts[-1]) == 0
    finally:
        cluster.close()
    assert wait_empty() == [], "closing the cluster left jobs"


@pytest.mark.timeout(240)
def test_train_slurm_from_the_command_line(slurm_conf, tmp_path):
    """tianji-dask train --plan --slurm with the site settings in a user's jobqueue.yaml."""
    import os

    import yaml

    site_dir = tmp_path / "dask"
    site_dir.mkdir()
    (site_dir / "jobqueue.yaml").write_text(
        yaml.safe_dump(
            {
                "jobqueue": {
                    "slurm": {
                        "interface": "lo",
                        "walltime": "00:06:00",
                        "log-directory": str(tmp_path / "logs"),
                        "local-directory": str(tmp_path / "scratch"),
                        "death-timeout": 30,
                    }
                }
            }
        )
    )
    cfg = load_config(CONFIG, [*SHORT])
    from tianji_dask.deploy.planner import save_plan

    save_plan(two_core_plan(cfg), tmp_path / "plan.yaml")
    env = dict(os.environ, DASK_CONFIG=str(site_dir))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tianji_dask.cli",
            "train",
            str(CONFIG),
            "--slurm",
            "--plan",
            str(tmp_path / "plan.yaml"),
            "--out",
            str(tmp_path / "run"),
            *[a for s in [*SHORT, "stop.max_env_steps=3000"] for a in ("--set", s)],
        ],
        capture_output=True,
        text=True,
        timeout=200,
        env=env,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "submitted 2 Slurm jobs" in out.stderr
    assert (tmp_path / "run" / "metrics.nc").exists()
    logs = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert any(n.startswith("tianji-") and "learner" in n for n in logs), logs  # jobqueue.yaml was honoured
    assert wait_empty() == []


@pytest.mark.timeout(240)
def test_a_planned_cluster_scales_down_and_back_up_to_its_plan(slurm_conf, jobqueue_defaults, tmp_path):
    import dask
    from distributed import Client

    from tianji_dask.deploy.slurm_cluster import PlannedSLURMCluster

    assert wait_empty() == [], "jobs left over from an earlier test"
    plan = two_core_plan(load_config(CONFIG, [*SHORT]))
    planned = {"tianji-t3-g0-learner": {"tianji_learner": 1, "tianji_group_0": 1}}
    planned["tianji-t3-g0-actors"] = {"tianji_actor": 1, "tianji_group_0": 1}
    # SpecCluster closes the job of a worker that left, by worker name, lost-worker-timeout later;
    # a job submitted again under that name before then would be cancelled with it.
    with dask.config.set({"distributed.deploy.lost-worker-timeout": "1s"}):
        cluster = PlannedSLURMCluster(plan, run_tag="t3", **site(tmp_path))
        try:
            with Client(cluster) as client:
                client.wait_for_workers(planned_processes(plan), timeout=90)
                first_jobs = squeue()
                cluster.scale(0)
                assert wait_empty() == []
                deadline = time.monotonic() + 30
                while scheduler_workers(client) and time.monotonic() < deadline:
                    time.sleep(0.2)
                assert scheduler_workers(client) == {}
                time.sleep(1.5)
                cluster.scale(jobs=len(plan.jobs))
                client.wait_for_workers(planned_processes(plan), timeout=90)
                again = squeue()
                assert sorted(name for _, name in again) == sorted(planned)
                assert not {job for job, _ in again} & {job for job, _ in first_jobs}, "new jobs, not the cancelled"
                resources = {w["name"]: w["resources"] for w in scheduler_workers(client).values()}
                assert resources == planned
        finally:
            cluster.close()
    assert wait_empty() == [], "closing the cluster left jobs"
