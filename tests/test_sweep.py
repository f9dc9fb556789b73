"""``tianji-dask sweep``: a grid of runs, K at a time, each in its own directory; bad grids are
refused before anything is written; a run killed mid-way is recorded failed and the others reach
their target; ``open_runs`` stacks them."""

from __future__ import annotations

import io
import logging
import os
import signal
import threading

import pytest
from conftest import cli_here, wait_until

from tianji_dask.runtime.sweep import plan_sweep

CONFIG = "configs/cartpole_dqn.yaml"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ([], "a sweep needs at least one --grid"),
        (["--grid", "seed"], "expected --grid key.path=V1,V2"),
        (["--grid", "seed=0,,1"], "expected --grid key.path=V1,V2"),
        (["--grid", "seed=0", "--grid", "seed=1"], "seed is given twice"),
        (["--grid", "algo.nope=1,2"], "sweep run algo.nope=1: "),
        (["--grid", "seed=0,1", "--parallel", "0"], "parallel=0"),
        (["--grid", "seed=0,1", "--slurm", "--scheduler", "tcp://127.0.0.1:1"], "give one"),
        (["--grid", "seed=0,1", "--walltime", "00:10:00"], "size the Slurm jobs of a sweep: add --slurm"),
        (["--grid", "topology.actors=1,2", "--slurm"], "needs other Slurm jobs than topology.actors=1"),
    ],
)
def test_a_bad_sweep_is_refused_before_anything_is_written(tmp_path, args, said):
    r = cli_here("sweep", CONFIG, *args, "--out", tmp_path / "sweep")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert said in r.stderr and not (tmp_path / "sweep").exists()


def test_a_sweep_never_writes_into_a_directory_with_files(tmp_path):
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "notes.txt").write_text("mine")
    r = cli_here("sweep", CONFIG, "--grid", "seed=0,1", "--out", tmp_path / "sweep")
    assert r.returncode == 2 and "exists and is not empty" in r.stderr
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir()) == ["notes.txt"]


def test_the_grid_is_every_combination_each_in_its_own_directory(tmp_path):
    planned = plan_sweep(CONFIG, ["seed=0,1", "algo.lr=1e-4,3e-4"], ["stop.max_env_steps=1000"], tmp_path / "s")
    assert [r.name for r in planned.runs] == [
        "seed=0__algo.lr=1e-4",
        "seed=0__algo.lr=3e-4",
        "seed=1__algo.lr=1e-4",
        "seed=1__algo.lr=3e-4",
    ]
    assert [(r.cfg.seed, r.cfg.algo.lr, r.cfg.stop.max_env_steps) for r in planned.runs][1] == (0, 3e-4, 1000)
    assert len({r.run_dir for r in planned.runs}) == 4 and not (tmp_path / "s").exists()


@pytest.mark.integration
@pytest.mark.timeout(280)
def test_four_seeds_two_at_a_time_one_killed_the_others_reach_their_target(tmp_path):
    from distributed import Client

    sets = ["stop.target_return=60", "stop.max_env_steps=80000", "stop.max_seconds=150", "run.max_restarts=0"]
    planned = plan_sweep(CONFIG, ["seed=0,1,2,3"], sets, tmp_path / "sweep")
    lines: list[str] = []
    runner = threading.Thread(target=planned.run, kwargs={"parallel": 2, "on_line": lines.append})
    runner.start()
    victim = planned.runs[1]
    assert wait_until(lambda: victim.handle is not None and victim.handle.scheduler_address, 120)
    assert wait_until(lambda: victim.handle.recorder.tally.env_steps > 0, 120)  # mid-way: it is stepping
    with Client(victim.handle.scheduler_address, timeout=10) as client:
        pids = list(client.run(os.getpid).values())
    assert pids
    for pid in pids:  # its workers killed: with run.max_restarts=0 the run fails
        os.kill(pid, signal.SIGKILL)
    runner.join(240)
    assert not runner.is_alive()
    statuses = {r.name: r.status for r in planned.runs}
    assert statuses == {
        "seed=0": "target_reached",
        "seed=1": "failed",
        "seed=2": "target_reached",
        "seed=3": "target_reached",
    }, (
        statuses,
        lines,
    )
    assert sum(line.startswith("[") and "started" in line for line in lines) == 4
    ds = planned.open()
    assert ds.sizes["run"] == 4 and sorted(ds["status"].values.tolist()).count("failed") == 1
    assert sorted(ds["seed"].values.tolist()) == [0, 1, 2, 3]


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_dask_stays_quiet_until_the_last_of_two_clusters_has_closed():
    """B1: two runs' LocalClusters in one process; the first to close must not turn Dask's INFO
    log back on for the other, whose shutdown would print some thirty INFO lines."""
    from tianji_dask.runtime.cluster import local_cluster

    handlers = [h for h in logging.getLogger("distributed").handlers if isinstance(h, logging.StreamHandler)]
    assert handlers, "Dask's logging config installs a stream handler on 'distributed'"
    levels = [h.level for h in handlers]
    printed = io.StringIO()
    streams = [h.setStream(printed) for h in handlers]
    try:
        first = local_cluster(1, dashboard=False, preload_roles=False)
        second = local_cluster(1, dashboard=False, preload_roles=False)
        first.close()
        second.close()
    finally:
        for h, stream in zip(handlers, streams):
            h.setStream(stream)
    assert " - INFO - " not in printed.getvalue(), printed.getvalue()
    assert [h.level for h in handlers] == levels  # the last to close put back what the first found
