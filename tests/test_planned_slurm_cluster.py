"""PlannedSLURMCluster without a Slurm: sbatch, scancel and sinfo are shell scripts on PATH that
keep what they were given, so the worker spec, the scripts a site's sbatch would get and the
scaling over the plan's jobs are checked in seconds. tests/test_slurm_run.py runs the real thing."""

from __future__ import annotations

import time

import dask
import pytest
from conftest import CONFIG, SHORT
from slurm_support import fake_command, six_core_plan

from tianji_dask.config import load_config

pytestmark = pytest.mark.usefixtures("jobqueue_defaults")

LEARNER, ACTORS = "tianji-t-g0-learner", "tianji-t-g0-actors"


@pytest.fixture
def fake_slurm(monkeypatch, tmp_path):
    """Folder where the fake sbatch copies each script it is given (``<job name>.sh``) and logs
    the names it submitted (``submitted``), and the fake scancel the job ids it cancelled
    (``cancelled``). sinfo knows no partition, so no plan is checked against a node. A job
    named in ``refuse`` makes sbatch fail as Slurm does for a job larger than its nodes."""
    seen = tmp_path / "seen"
    seen.mkdir()
    bin_dir = tmp_path / "bin"
    fake_command(
        monkeypatch,
        bin_dir,
        "sbatch",
        f"""name=$(sed -n 's/^#SBATCH -J //p' "$1")
if grep -qx "$name" {seen}/refuse 2>/dev/null; then
    echo "sbatch: error: Batch job submission failed: More processors requested than permitted" >&2
    exit 1
fi
cp "$1" {seen}/"$name".sh
echo "$name" >> {seen}/submitted
echo "Submitted batch job $$\"""",
    )
    fake_command(monkeypatch, bin_dir, "scancel", f'echo "$@" >> {seen}/cancelled')
    fake_command(monkeypatch, bin_dir, "sinfo", "true")
    return seen


def site(tmp_path) -> dict:
    return dict(
        walltime="00:07:00",
        queue="short",
        log_directory=str(tmp_path / "logs"),
        scheduler_options={"dashboard_address": "127.0.0.1:0"},
    )


def lines(path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    return predicate()


def test_the_worker_spec_and_the_submitted_scripts_are_the_plans(fake_slurm, tmp_path):
    from tianji_dask.deploy.slurm_cluster import PlannedSLURMCluster, PlannedSLURMJob

    plan = six_core_plan(load_config(CONFIG, [*SHORT]))
    learner, actors = plan.jobs
    yaml = {"jobqueue.slurm.account": "proj-x", "jobqueue.slurm.interface": "lo"}  # as in a jobqueue.yaml
    with dask.config.set(yaml), PlannedSLURMCluster(plan, run_tag="t", **site(tmp_path)) as cluster:
        spec = cluster.worker_spec
        assert list(spec) == [LEARNER, ACTORS]
        for name, job, kind in ((LEARNER, learner, "tianji_learner"), (ACTORS, actors, "tianji_actor")):
            options = spec[name]["options"]
            assert spec[name]["cls"] is PlannedSLURMJob
            assert (options["cores"], options["processes"]) == (job.cores, job.processes)
            assert options["memory"] == f"{job.memory_bytes}B" and options["job_name"] == name
            assert options["worker_extra_args"][-2:] == ["--resources", f"{kind}=1,tianji_group_0=1"]
            assert (options["walltime"], options["queue"], options["interface"]) == ("00:07:00", "short", "lo")
        assert "group" not in spec[LEARNER] and spec[ACTORS]["group"] == ["-0", "-1", "-2", "-3"]
        assert sorted(lines(fake_slurm / "submitted")) == sorted(spec)

    from dask_jobqueue.slurm import slurm_format_bytes_ceil

    learner_script, actors_script = ((fake_slurm / f"{n}.sh").read_text() for n in (LEARNER, ACTORS))
    for script, job, kind in ((learner_script, learner, "learner"), (actors_script, actors, "actor")):
        assert f"#SBATCH --cpus-per-task={job.cores}\n" in script
        assert f"#SBATCH --mem={slurm_format_bytes_ceil(job.memory_bytes)}\n" in script
        assert f"--resources tianji_{kind}=1,tianji_group_0=1" in script
        assert "#SBATCH -A proj-x\n" in script and "#SBATCH -p short\n" in script and "#SBATCH -t 00:07:00\n" in script
        assert "--interface lo" in script
    assert "--nworkers 4" in actors_script and "--nworkers" not in learner_script
    assert len(lines(fake_slurm / "cancelled")) == 2  # closing the cluster cancelled both jobs


def test_scaling_keeps_the_plans_first_jobs_and_never_grows_past_them(fake_slurm, tmp_path):
    import dataclasses

    from tianji_dask.deploy.slurm_cluster import PlannedSLURMCluster

    one = six_core_plan(load_config(CONFIG, [*SHORT]))
    plan = dataclasses.replace(one, jobs=[*one.jobs, *(dataclasses.replace(j, group=1) for j in one.jobs)])
    assert [(j.kind, j.group) for j in plan.jobs] == [("learner", 0), ("actors", 0), ("learner", 1), ("actors", 1)]
    names = [LEARNER, ACTORS, "tianji-t-g1-learner", "tianji-t-g1-actors"]
    with PlannedSLURMCluster(plan, run_tag="t", **site(tmp_path)) as cluster:
        assert list(cluster.worker_spec) == names
        assert wait_for(lambda: len(lines(fake_slurm / "submitted")) == 4)
        # SpecCluster alone would drop jobs not yet running in any order; three rounds make a
        # chance pass of that unlikely (1 in 1,728)
        for _ in range(3):
            cluster.scale(jobs=2)
            assert list(cluster.worker_spec) == names[:2]
            cluster.scale(jobs=1)
            assert list(cluster.worker_spec) == names[:1]
            cluster.scale(jobs=4)
            assert list(cluster.worker_spec) == names
        cluster.scale(0)
        assert cluster.worker_spec == {}
        cluster.scale(n=6)  # group 0's jobs hold 1 + 4 workers, the 6th is group 1's learner
        assert list(cluster.worker_spec) == names[:3]
        for too_many in (dict(jobs=5), dict(n=11)):
            with pytest.raises(ValueError, match="the plan"):
                cluster.scale(**too_many)
        with pytest.raises(ValueError, match="not memory or cores"):
            cluster.scale(cores=4)
        assert list(cluster.worker_spec) == names[:3]
        submitted = len(lines(fake_slurm / "submitted"))
    assert wait_for(lambda: len(lines(fake_slurm / "cancelled")) == submitted)  # each job cancelled once


def test_a_refused_job_cancels_the_submitted_ones_and_closes_the_cluster(fake_slurm, tmp_path):
    from distributed.core import Status

    from tianji_dask.deploy.slurm_cluster import PlannedSLURMCluster, SlurmSubmitError

    begun = []

    class Watched(PlannedSLURMCluster):
        def __init__(self, *args, **kwargs):
            begun.append(self)
            super().__init__(*args, **kwargs)

    (fake_slurm / "refuse").write_text(f"{ACTORS}\n")
    plan = six_core_plan(load_config(CONFIG, [*SHORT]))
    with pytest.raises(SlurmSubmitError, match="(?s)More processors requested than permitted.*were cancelled"):
        Watched(plan, run_tag="t", **site(tmp_path))
    assert lines(fake_slurm / "submitted") == [LEARNER]
    assert len(lines(fake_slurm / "cancelled")) == 1
    assert begun[0].status == Status.closed
