"""dask-jobqueue's SLURMCluster against a real local Slurm (jobqueue/local-slurm.sh).

Skipped without one, failed without one when TIANJI_REQUIRE_SLURM=1 (CI); see slurm_support.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from slurm_support import SCRIPT

from tianji_dask.runtime.cluster.workers import scheduler_workers

pytestmark = pytest.mark.slurm


def squeue_ids() -> list[str]:
    r = subprocess.run(["squeue", "-h", "-o", "%A"], capture_output=True, text=True, timeout=15)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def wait_queue_empty(timeout: float = 20.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while (ids := squeue_ids()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return ids


def node_cpus() -> int:
    r = subprocess.run(["sinfo", "-h", "-o", "%c"], capture_output=True, text=True, timeout=15)
    assert r.returncode == 0, r.stderr
    return int(r.stdout.split()[0].rstrip("+"))


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.timeout(180)
def test_slurmcluster_scale_compute_close(slurm_conf, jobqueue_defaults, tmp_path):
    from dask_jobqueue import SLURMCluster
    from distributed import Client

    assert wait_queue_empty() == [], "jobs left over from an earlier test"
    cluster = SLURMCluster(
        cores=1,
        processes=1,
        memory="1GiB",
        walltime="00:05:00",
        interface="lo",
        job_name="tianji-test",
        log_directory=str(tmp_path / "logs"),
        local_directory=str(tmp_path / "scratch"),
        death_timeout=30,
        scheduler_options={"dashboard_address": "127.0.0.1:0"},
    )
    try:
        script = cluster.job_script()
        assert "#SBATCH --cpus-per-task=1" in script and "#SBATCH --mem=1G" in script
        assert "#SBATCH -t 00:05:00" in script
        with Client(cluster) as client:
            cluster.scale(jobs=2)
            client.wait_for_workers(2, timeout=60)
            assert len(squeue_ids()) == 2
            # the workers really are Slurm jobs of this Slurm
            job_ids = client.run(lambda: os.environ.get("SLURM_JOB_ID"))
            assert len(job_ids) == 2 and all(job_ids.values())
            assert sorted(job_ids.values()) == sorted(squeue_ids())
            assert client.submit(sum, range(10)).result(timeout=30) == 45
            assert sum(client.gather(client.map(lambda x: x * x, range(20)))) == 2470
            cluster.scale(0)
            deadline = time.monotonic() + 30
            while scheduler_workers(client) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert scheduler_workers(client) == {}
    finally:
        cluster.close()
    assert wait_queue_empty() == [], "SLURMCluster.close() left jobs in the queue"
    logs = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert any(n.startswith("tianji-test-") and n.endswith(".err") for n in logs), logs


def test_oversized_job_rejected_at_submit(slurm_conf, jobqueue_defaults, tmp_path):
    """EnforcePartLimits=ALL: a job bigger than the node fails at sbatch time (it does not sit
    PENDING forever) with Slurm's own message; a fitting one passes --test-only."""
    from dask_jobqueue.slurm import SLURMJob

    def job_script(cores: int) -> Path:
        job = SLURMJob(
            scheduler="tcp://127.0.0.1:1",
            name="probe",
            cores=cores,
            processes=1,
            memory="1GiB",
            walltime="00:01:00",
            python=sys.executable,
        )
        path = tmp_path / f"job-{cores}.sh"
        path.write_text(job.job_script(), encoding="utf-8")
        return path

    def test_only(path: Path) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["sbatch", "--test-only", str(path)],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=tmp_path,
        )

    cpus = node_cpus()
    big = test_only(job_script(cpus + 1))
    assert big.returncode != 0, big.stdout + big.stderr
    assert "More processors requested than permitted" in big.stderr, big.stderr
    ok = test_only(job_script(1))
    assert ok.returncode == 0, ok.stderr
    assert "to start at" in ok.stderr, ok.stderr
    assert squeue_ids() == []  # --test-only submits nothing


def test_script_status_env_and_refusals(slurm_conf):
    state = str(Path(slurm_conf).parent)
    st = run_script("status", state)
    assert st.returncode == 0, st.stdout + st.stderr
    for daemon in ("munged", "slurmctld", "slurmd"):
        assert f"{daemon}:" in st.stdout and "not running" not in st.stdout, st.stdout
    assert "PARTITION" in st.stdout and "debug*" in st.stdout, st.stdout

    env = run_script("env", state)
    assert env.returncode == 0, env.stderr
    prefix = "export SLURM_CONF="
    assert env.stdout.startswith(prefix) and env.stdout.count("\n") == 1, env.stdout
    assert Path(env.stdout[len(prefix) :].strip()).resolve() == Path(slurm_conf).resolve()

    missing = run_script("status")
    assert missing.returncode == 2 and "missing STATE_DIR" in missing.stderr, missing.stderr
    if os.geteuid() == 0 and shutil.which("runuser"):
        # `start` on a running Slurm is a quick no-op
        t0 = time.monotonic()
        again = run_script("start", state)
        assert again.returncode == 0 and "already running" in again.stderr, again.stderr
        assert time.monotonic() - t0 < 10
        # and start/stop refuse to run as anyone but root
        r = subprocess.run(
            ["runuser", "-u", "nobody", "--", "bash", str(SCRIPT), "start", state],
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
        )
        assert r.returncode == 1 and "must be run as root" in r.stderr, r.stderr


@pytest.mark.timeout(120)
def test_a_plans_gpu_jobs_are_scheduled_by_slurm_and_never_straddle_nodes(slurm_conf, jobqueue_defaults, tmp_path):
    """The local node declares 2 GPUs by count (LOCAL_SLURM_GPUS): each group job of a plan for
    two such nodes (a learner and an actor sharing a GPU, --gres=gpu:1) fits one node and passes
    sbatch --test-only; the same job asking for more GPUs than a node has is refused by Slurm."""
    from test_planner_gpu import pong, profile

    from tianji_dask.deploy.planner import Resources, make_plan
    from tianji_dask.deploy.slurm import check_fits, job_scripts

    cpus = node_cpus()
    plan = make_plan(pong(), profile(), Resources(cores=2 * cpus, nodes=2, cores_per_node=cpus, gpus=2))
    assert [(j.kind, j.node, j.gpus) for j in plan.jobs] == [("group", 0, 1), ("group", 1, 1)]
    assert all(j.cores <= cpus for j in plan.jobs)
    check_fits(plan)  # against sinfo: no job larger than the node

    def test_only(script: str) -> subprocess.CompletedProcess:
        path = tmp_path / "job.sh"
        path.write_text(script, encoding="utf-8")
        return subprocess.run(
            ["sbatch", "--test-only", str(path)], capture_output=True, text=True, timeout=30, cwd=tmp_path
        )

    for _, script in job_scripts(plan, python=sys.executable, walltime="00:01:00"):
        assert "#SBATCH --gres=gpu:1" in script
        ok = test_only(script)
        assert ok.returncode == 0 and "to start at" in ok.stderr, ok.stderr
    too_many = test_only(script.replace("--gres=gpu:1", "--gres=gpu:3"))
    assert too_many.returncode != 0, too_many.stderr
    assert squeue_ids() == []  # --test-only submits nothing


@pytest.mark.integration
@pytest.mark.timeout(360)
def test_a_multi_node_plan_runs_one_job_a_group_on_slurm_nodes_in_network_namespaces(
    slurm_conf, jobqueue_defaults, tmp_path, monkeypatch
):
    """A second local Slurm whose two nodes are network namespaces (LOCAL_SLURM_NETNS: a slurmd
    in each, so its jobs run behind a veth link): a plan for two such nodes makes one job a
    group; Slurm runs them on the two nodes; every worker of a job listens on the address of the
    node Slurm ran that job on (a group never straddles two nodes); a DQN run of the two groups
    on those workers finishes, its traffic on both nodes' links."""
    from conftest import CONFIG, SHORT
    from distributed import Client
    from netns_support import PREFIX, address, link_bytes, nodes_up
    from slurm_support import two_core_profile

    from tianji_dask.config import load_config
    from tianji_dask.deploy.planner import Resources, make_plan
    from tianji_dask.deploy.slurm import planned_processes
    from tianji_dask.deploy.slurm_cluster import PlannedSLURMCluster
    from tianji_dask.runtime.driver import train

    nodes = nodes_up(2, tmp_path)
    names = {f"{PREFIX}-{k}": address(k) for k in (1, 2)}
    # munged wants every directory above its socket open to all: pytest's tmp_path is not
    state = Path(tempfile.mkdtemp(prefix="tianji-slurm-nodes-"))
    state.chmod(0o755)
    env = {**os.environ, "LOCAL_SLURM_NETNS": " ".join(names)}
    cluster = None
    try:
        r = subprocess.run(
            ["bash", str(SCRIPT), "start", str(state)], env=env, capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0, r.stderr
        monkeypatch.setenv("SLURM_CONF", str(state / "slurm.conf"))
        sinfo = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=15)
        assert sorted(sinfo.stdout.split("\n")[:-1]) == [f"{n} idle" for n in sorted(names)], sinfo.stdout
        cpus = node_cpus()
        overrides = [*SHORT, "stop.max_env_steps=3000", "stop.max_seconds=120"]
        cfg = load_config(CONFIG, overrides)
        plan = make_plan(cfg, two_core_profile(), Resources(cores=2 * cpus, nodes=2, cores_per_node=cpus))
        assert [(j.kind, j.group, j.node) for j in plan.jobs] == [("group", 0, 0), ("group", 1, 1)]
        cfg = plan.apply(cfg)
        cluster = PlannedSLURMCluster(
            plan,
            run_tag="mn",
            walltime="00:10:00",
            log_directory=str(tmp_path / "logs"),
            local_directory=str(tmp_path / "scratch"),
            death_timeout=30,
            scheduler_options={"host": address(0), "dashboard_address": f"{address(0)}:0"},
        )
        with Client(cluster) as client:
            client.wait_for_workers(planned_processes(plan), timeout=120)
            squeue = subprocess.run(["squeue", "-h", "-o", "%j %N"], capture_output=True, text=True, timeout=15)
            placed = dict(line.split() for line in squeue.stdout.splitlines())
            assert sorted(placed) == ["tianji-mn-g0-group", "tianji-mn-g1-group"]
            assert sorted(placed.values()) == sorted(names), placed  # one group a node
            for w in scheduler_workers(client).values():
                job = w["name"].rsplit("-", 1)[0]
                assert w["host"] == names[placed[job]], (w["name"], w["host"], placed)
            before = {k: sum(link_bytes(k)) for k in (1, 2)}
            run = train(cfg, client, out=tmp_path / "run")
            result = run.wait()
            assert result.ok, result.error
            assert all(sum(link_bytes(k)) > before[k] for k in (1, 2))
    finally:
        if cluster is not None:
            cluster.close()
        subprocess.run(["bash", str(SCRIPT), "stop", str(state)], env=env, capture_output=True, timeout=120)
        nodes.stop()
        shutil.rmtree(state, ignore_errors=True)
