"""A run across nodes with network stacks of their own (tests/netns_support.py): the learner's
node and two actor nodes, joined by veth links to a bridge, the scheduler on the bridge. Every
trajectory byte has to cross the links: the links' counters must show at least the bytes of all
the transitions the run produced. Needs root (CI); see netns_support for when it skips."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import xarray as xr
from conftest import CONFIG
from netns_support import address, link_bytes, nodes_up

pytestmark = pytest.mark.integration

# A CartPole transition as the actors send it: obs and next_obs (4 float32 each), the action
# (int64), the n-step return and the discount (float32).
TRANSITION_BYTES = 2 * 4 * 4 + 8 + 4 + 4


@pytest.fixture
def nodes(tmp_path):
    n = nodes_up(3, tmp_path)
    try:
        yield n
    finally:
        n.stop()


@pytest.mark.timeout(360)
def test_a_run_with_its_learner_and_actors_on_three_nodes_reaches_its_target_through_the_links(nodes, tmp_path):
    scheduler = nodes.start_scheduler()
    nodes.start_worker(1, "node1-learner", {"tianji_learner": 1, "tianji_group_0": 1})
    for k in (2, 3):
        nodes.start_worker(k, f"node{k}-actor", {"tianji_actor": 1, "tianji_group_0": 1})
    workers = nodes.wait_for_workers(3)
    assert sorted(w["host"] for w in workers.values()) == [address(1), address(2), address(3)]
    before = {k: link_bytes(k) for k in (1, 2, 3)}
    r = subprocess.run(
        [sys.executable, "-m", "tianji_dask.cli", "train", str(CONFIG), "--scheduler", scheduler,
         "--set", "topology.actors=2", "--set", "stop.target_return=100", "--out", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=330, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    with xr.open_dataset(tmp_path / "run" / "metrics.nc", engine="netcdf4") as ds:
        assert ds.attrs["status"] == "target_reached", ds.attrs["status"]
        env_steps = int(ds.env_steps.max())
    sent = sum(link_bytes(k)[0] - before[k][0] for k in (2, 3))  # out of the actors' nodes
    received = link_bytes(1)[1] - before[1][1]  # into the learner's node
    produced = env_steps * TRANSITION_BYTES
    print(f"\ntransitions {produced:,} B; out of the actor nodes {sent:,} B, into the learner's {received:,} B")
    assert sent >= produced and received >= produced, (sent, received, produced)


@pytest.mark.timeout(300)
def test_the_link_benchmark_measures_both_transports_on_a_limited_link(tmp_path):
    """benchmarks/link_throughput.py on its smallest case, twice: a 100 Mbit/s link caps both."""
    from netns_support import require_netns

    require_netns()
    out = tmp_path / "lt"
    r = subprocess.run(
        [sys.executable, "benchmarks/link_throughput.py", "--rates", "100mbit", "--sizes", "262144",
         "--messages", "40", "--capacity-mb", "4", "--repeats", "2", "--out", str(out)],
        capture_output=True, text=True, timeout=280, cwd=CONFIG.parent.parent,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    with xr.open_dataset(out / "link_throughput.nc", engine="netcdf4") as ds:
        raw, channel = float(ds.raw_tcp_bytes_per_s.item()), float(ds.channel_bytes_per_s.item())
        sender_cpu, receiver_cpu = float(ds.channel_t_sd.item()), float(ds.channel_t_rv.item())
        credit_wait = float(ds.channel_credit_wait_time.item())
        assert ds.attrs["capacity_mb"] == 4 and ds.attrs["repeats"] == 2
        raw_runs, channel_runs = ds.raw_tcp_bytes_per_s_runs.values.ravel(), ds.channel_bytes_per_s_runs.values.ravel()
    assert len(raw_runs) == len(channel_runs) == 2 and np.all(raw_runs > 0) and np.all(channel_runs > 0)
    assert raw == np.median(raw_runs) and channel == np.median(channel_runs)  # the reported figures
    assert 6e6 < raw < 14e6 and 6e6 < channel < 14e6, (raw, channel)  # 100 Mbit/s = 12.5 MB/s
    per_message = 262144 / channel  # the link binds: each end's CPU is a fraction of a message's time
    assert 0 < sender_cpu < per_message and 0 < receiver_cpu < per_message, (sender_cpu, receiver_cpu, per_message)
    assert 0 <= credit_wait < 2 * per_message, credit_wait


def test_the_link_benchmark_refuses_a_window_of_nothing_and_no_repeats_before_any_work():
    r = subprocess.run(
        [sys.executable, "benchmarks/link_throughput.py", "--capacity-mb", "0"],
        capture_output=True, text=True, timeout=60, cwd=CONFIG.parent.parent,
    )  # fmt: skip
    assert r.returncode == 2 and "--capacity-mb must be positive, got 0.0" in r.stderr, r.stderr
    r = subprocess.run(
        [sys.executable, "benchmarks/link_throughput.py", "--repeats", "0"],
        capture_output=True, text=True, timeout=60, cwd=CONFIG.parent.parent,
    )  # fmt: skip
    assert r.returncode == 2 and "--repeats must be at least 1, got 0" in r.stderr, r.stderr


@pytest.mark.timeout(300)
def test_the_nodes_benchmark_spreads_its_actors_over_the_nodes_and_measures_both_transports(tmp_path):
    """benchmarks/nodes_comm.py (Fig. 5c) on two nodes: its first actor shares the receiver's node,
    its second sends from the other one, so only the case with two actors crosses node 1's link."""
    from netns_support import require_netns

    require_netns()
    out, size, messages = tmp_path / "nc", 65536, 60
    r = subprocess.run(
        [sys.executable, "benchmarks/nodes_comm.py", "--nodes", "2", "--max-actors", "2", "--sample-times", "0.001",
         "--messages", str(messages), "--message-bytes", str(size), "--rate", "100mbit", "--out", str(out)],
        capture_output=True, text=True, timeout=280, cwd=CONFIG.parent.parent,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    with xr.open_dataset(out / "nodes_comm.nc", engine="netcdf4") as ds:
        assert ds.attrs["nodes"] == 2 and ds.attrs["rate"] == "100mbit"
        one, two = ds.sel(sample_time=0.001, actors=1), ds.sel(sample_time=0.001, actors=2)
        payload = messages * size
        for transport in ("raw_tcp", "channel"):
            assert float(one[f"{transport}_link_bytes"]) < 0.1 * payload, transport  # the receiver's own node
            assert float(two[f"{transport}_link_bytes"]) > 0.1 * payload, transport  # the second node's share
            for case in (one, two):
                assert 0 < float(case[f"{transport}_collection_time"]) < 60
    assert (out / "nodes_comm.png").stat().st_size > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sample-times", "1ms"], "--sample-times '1ms': give seconds separated by commas"),
        (["--rate", "1gigabit"], "--rate '1gigabit': give tc's form"),
        (["--nodes", "0"], "--nodes must be at least 1"),
    ],
)
def test_the_nodes_benchmark_refuses_bad_arguments_before_making_nodes(args, message):
    r = subprocess.run(
        [sys.executable, "benchmarks/nodes_comm.py", *args],
        capture_output=True, text=True, timeout=60, cwd=CONFIG.parent.parent,
    )  # fmt: skip
    assert r.returncode == 2 and message in r.stderr, r.stderr


def test_node_processes_import_what_the_caller_imports(monkeypatch, tmp_path):
    """A scheduler or worker started in a node keeps the caller's PYTHONPATH after the repository
    (where packages come from a PYTHONPATH, as on the GPU machines, it could not start without)."""
    from netns_support import Nodes

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/opt/site", "/opt/more"]))
    nodes = Nodes(1, tmp_path / "scheduler.json")
    nodes.pythonpath.append("/extra")
    path = nodes._env()["PYTHONPATH"].split(os.pathsep)
    assert path[1:] == ["/extra", "/opt/site", "/opt/more"] and path[0] == nodes.pythonpath[0]
