"""Memory stays bounded when the learner is far slower than the actor.

The learner is made slow by real work (a 3 x 1024 Q-network on batches of 2048) and the balance
controller is off (``algo.ratio_tolerance=null``), so the actor produces at full speed. While the
run goes on, the test samples every host from inside its worker (``client.run``): the trajectory
inbox's queued bytes, the actor's outstanding bytes, the replay memory's size and the buffer
worker's RSS. Each must stay within its configured bound for the whole run.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import cloudpickle
import numpy as np
import psutil
import pytest
from distributed import Client

from tianji_dask.config import load_config
from tianji_dask.runtime.driver import train

pytestmark = pytest.mark.integration

# Workers may not be able to import this test module: ship its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

# The buffer shares its worker process with the learner. A worker with torch, gymnasium and
# Dask loaded is ~330 MB before any host exists, and this slow learner's own working set (3 x 1024
# network, Adam, activations of 4096-row forward passes) adds ~190 MB: the buffer worker measured
# 450-521 MB while training. 400 MB cannot hold that learner, so the absolute cap is 600 MB and
# the real check is on growth: once training runs, data flowing through the channel into a full
# replay memory must not make the process grow.
RSS_LIMIT_MB = 600
RSS_GROWTH_MB = 48


def probe(dask_worker) -> dict:
    """One sample of the run's hosts on this worker (runs on the worker's event loop)."""
    from tianji_dask.runtime.hosts.hosts import ActorHost, BufferHost

    out = {"pid": os.getpid(), "rss_mb": psutil.Process().memory_info().rss / 1e6}
    for host in list(dask_worker.state.actors.values()):
        if isinstance(host, BufferHost) and host.role is not None:
            role = host.role
            out["inbox"] = role.inbox.stats()
            out["replay_len"] = len(role.replay)
            out["replay_capacity"] = role.replay.capacity
            out["replay_nbytes"] = role.replay.nbytes
            out["received"] = role.received
        elif isinstance(host, ActorHost) and getattr(host, "sender", None) is not None:
            out["sender"] = host.sender.stats()
            out["sender_capacity"] = host.sender.capacity_bytes
    return out


@pytest.mark.timeout(120)
def test_bounded_memory_with_a_slow_learner(h, tmp_path):
    cfg = load_config(
        h.CONFIG,
        [
            "stop.target_return=null",
            # three replays' worth of env steps: the replay wraps and the slow learner updates
            # whatever the machine's speed (a time budget made too few steps on a slow machine)
            "stop.max_env_steps=12288",
            "stop.max_seconds=80",  # a guard only
            "algo.hidden_sizes=[1024,1024,1024]",
            "algo.batch_size=2048",
            "algo.learning_starts=2048",
            "algo.buffer_size=4096",
            "algo.ratio_tolerance=null",
            "channel.capacity_mb=1",
            "run.checkpoint=false",
            # heartbeats are sent between loop steps: one update of this learner takes ~0.8 s alone
            # and several seconds on a busy machine, which must not count as a lost host
            "run.heartbeat_timeout=30",
        ],
    )
    capacity = cfg.channel.capacity_bytes
    samples: list[dict] = []
    with (
        h.forked_local_cluster(n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        run = train(cfg, client, out=tmp_path / "slow")
        stop_probing = threading.Event()

        def poll():
            while not stop_probing.is_set() and not run.done:
                try:
                    samples.append({"t": time.monotonic(), **{w: v for w, v in client.run(probe).items()}})
                except Exception as exc:  # noqa: BLE001 - hosts come and go at the ends of the run
                    samples.append({"t": time.monotonic(), "error": repr(exc)})
                stop_probing.wait(0.05)  # the actor may make its steps in 2-3 s: sample often

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        result = run.wait(timeout=90)
        stop_probing.set()
        poller.join(10)
        assert result is not None and result.error is None, result and result.error
        assert result.status == "max_env_steps", (result.status, result.env_steps, result.wall_s)
        ds = run.metrics()
        # also by psutil from outside, after the run, on the same worker processes
        rss_after = {w: psutil.Process(pid).memory_info().rss / 1e6 for w, pid in client.run(os.getpid).items()}

    buffer_samples = [s for row in samples for w, s in row.items() if isinstance(s, dict) and "inbox" in s]
    actor_samples = [s for row in samples for w, s in row.items() if isinstance(s, dict) and "sender" in s]
    assert len(buffer_samples) >= 10 and len(actor_samples) >= 10, samples[-3:]

    inbox_cap = buffer_samples[-1]["inbox"]["capacity_bytes"]
    assert inbox_cap == capacity * cfg.topology.actors
    max_queued = max(s["inbox"]["max_queued_bytes"] for s in buffer_samples)
    max_outstanding = max(s["sender"]["outstanding_bytes"] for s in actor_samples)
    max_len = max(s["replay_len"] for s in buffer_samples)
    nbytes = {s["replay_nbytes"] for s in buffer_samples}
    max_rss = max(s["rss_mb"] for s in buffer_samples)
    received = buffer_samples[-1]["received"]
    updates = int(ds["updates"][-1])
    blocked = float(ds["blocked_s"][-1])

    report = (
        f"received {received} transitions ({buffer_samples[-1]['inbox']['received_bytes'] / 1e6:.1f} MB), "
        f"{updates} updates (replay ratio {float(ds['replay_ratio'][-1]):.2f}, target "
        f"{cfg.algo.target_replay_ratio:g}); inbox max queued {max_queued} B of {inbox_cap} B; "
        f"sender max outstanding {max_outstanding} B of {capacity} B; actor blocked {blocked:.2f} s; "
        f"replay max {max_len} of {cfg.algo.buffer_size} ({nbytes} B); buffer worker RSS max "
        f"{max_rss:.0f} MB during, {rss_after} after; {len(buffer_samples)} samples"
    )
    print("\nbackpressure:", report)
    print("buffer worker (RSS MB, replay size):", [(round(s["rss_mb"]), s["replay_len"]) for s in buffer_samples])

    # The scenario is real: the learner consumed far less than the actor produced, and the
    # replay memory wrapped around (received more than it holds).
    assert updates >= 1, report
    assert float(ds["replay_ratio"][-1]) < cfg.algo.target_replay_ratio / 4, report
    assert received > cfg.algo.buffer_size, report
    # Bounds, over the whole run.
    assert max_queued <= inbox_cap, report
    assert max_outstanding <= capacity, report
    assert max_len <= cfg.algo.buffer_size and buffer_samples[-1]["replay_len"] == cfg.algo.buffer_size, report
    assert len(nbytes) == 1, report  # preallocated: never grows
    assert max_rss < RSS_LIMIT_MB, report
    assert np.nanmax(ds["buffer_rss_mb"].values) < RSS_LIMIT_MB, report  # the heartbeats agree
    # steady state: the second half of the training samples sits no higher than the first half.
    # Medians, not peaks: a sample taken inside an update holds that update's activations (one
    # sample 60 MB above its neighbours, then back), where growth raises every later sample.
    training = [s["rss_mb"] for s in buffer_samples if s["replay_len"] >= cfg.algo.learning_starts]
    assert len(training) >= 8, report
    half = len(training) // 2
    assert np.median(training[half:]) <= np.median(training[:half]) + RSS_GROWTH_MB, (training, report)
    assert np.nanmax(ds["replay_size"].values) <= cfg.algo.buffer_size
    assert np.nanmax(ds["replay_fill"].values) <= 1.0
