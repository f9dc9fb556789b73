"""Runs that survive a lost worker: real LocalClusters, real ``kill -9`` of a host's worker
process mid-run. The run re-creates the lost hosts (an actor alone; a learner with its buffer
and its whole group, restored from the newest snapshot), reaches its target and records the
restarts and what was lost. Also the parts: the restart policy, the placement moved to a
replacement worker, the recorder's incarnations, and a topic subscriber moved."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time

import numpy as np
import pytest
from distributed import Client

from tianji_dask.config import load_config
from tianji_dask.errors import HostLost
from tianji_dask.results.recorder import MetricsRecorder
from tianji_dask.roles.heartbeats import ActorCounters, Heartbeat
from tianji_dask.runtime.cluster.placement import moved, place
from tianji_dask.runtime.cluster.restarts import LostWorker, RestartPolicy, lost_with, replay_lost
from tianji_dask.runtime.cluster.workers import scheduler_workers
from tianji_dask.runtime.driver import train


def _kill_worker_of(run, cfg, pick, ready=lambda: True) -> str:
    """SIGKILL the worker process that ``pick(placement)`` names, once the run is producing
    and ``ready()``."""
    t0 = time.monotonic()
    with Client(run.wait_for_cluster(), timeout="10s") as client:
        while (run.recorder.tally.env_steps < 6000 or not ready()) and not run.done and time.monotonic() - t0 < 90:
            time.sleep(0.1)
        assert not run.done, run.result
        victim = pick(place(scheduler_workers(client), cfg.topology, "any", cfg.seed))
        pid = client.run(os.getpid, workers=[victim])[victim]
    os.kill(pid, signal.SIGKILL)
    return victim


def went_on(ds, restarts: str, var: str, actor: int | None = None) -> float:
    """How far ``var`` (of ``actor``) went past its value before the first row in which
    ``restarts`` counts a re-created host; 0 until then."""
    if ds.sizes["time"] == 0 or not (ds[restarts].values > 0).any():
        return 0.0
    at = int(np.argmax(ds[restarts].values > 0))
    values = (ds[var] if actor is None else ds[var].sel(actor=actor)).values
    return float(np.nanmax(values[at:]) - np.nanmax(values[:at])) if at else 0.0


@contextlib.contextmanager
def _snapshot_log_into(events: list[str]):
    """The snapshot keeper's debug log (the first snapshot a lost learner can be restored from:
    not news for the run's user) appended to ``events``."""

    class Append(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            events.append(record.getMessage())

    log, handler = logging.getLogger("tianji_dask.snapshots"), Append(logging.DEBUG)
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def _run_with_a_kill(h, tmp_path, pick, going_on, *overrides, ready=lambda events: True):
    """A run with no stop rule, one worker killed at 6,000 env steps and once ``ready(events)``; stopped once
    ``going_on(metrics)`` says the re-created hosts carried on (a target could come before the
    loss is seen, and nothing would be re-created)."""
    cfg = load_config(
        "configs/cartpole_dqn.yaml",
        ["stop.target_return=null", "stop.max_env_steps=null", "stop.max_seconds=200", *overrides],
    )
    events: list[str] = []
    with _snapshot_log_into(events), h.ending(train(cfg, out=tmp_path / "run", on_event=events.append)) as run:
        victim = _kill_worker_of(run, cfg, pick, lambda: ready(events))
        assert h.wait_until(lambda: going_on(run.metrics()) or run.done, timeout=170), events
        run.stop()
        result = run.wait(timeout=60)
    assert result is not None and result.status == "stopped", (result, events)
    lost = [e for e in events if e.startswith("host lost:")]
    assert len(lost) == 1 and victim in lost[0] and "killed by signal 9" in lost[0], "\n".join(events)
    ds = run.metrics()
    assert np.all(np.diff(ds.env_steps.values) >= 0) and np.all(np.diff(ds.updates.values) >= 0)
    return result, ds, lost[0], events


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_a_killed_actor_worker_is_recreated_and_the_run_reaches_its_target(h, tmp_path):
    result, ds, lost, events = _run_with_a_kill(
        h,
        tmp_path,
        lambda plan: plan.actors[1].worker,
        lambda ds: went_on(ds, "actor_restarts", "actor_env_steps", actor=1) > 1000,
        "topology.actors=2",
    )
    assert "actor 1 on" in lost
    last = ds.isel(time=-1)
    assert int(last.actor_restarts) == 1 and int(last.learner_restarts) == int(last.buffer_restarts) == 0
    assert int(last.lost_episodes) == 8  # the killed actor's envs were each in an episode
    assert int(last.lost_replay) == 0 and int(last.lost_updates) == 0
    # the new actor produced: its env steps went on past what its predecessor had made
    steps = ds.actor_env_steps.sel(actor=1).values
    killed_at = int(np.argmax(ds.actor_restarts.values > 0))
    assert np.nanmax(steps[killed_at:]) > np.nanmax(steps[:killed_at]) + 1000, steps


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_a_killed_learner_worker_rebuilds_its_group_from_the_newest_snapshot(h, tmp_path):
    result, ds, lost, events = _run_with_a_kill(
        h,
        tmp_path,
        lambda plan: plan.learners[0].worker,
        lambda ds: went_on(ds, "learner_restarts", "updates") > 2000,
        "topology.actors=2",
        "run.snapshot_interval=1",
        ready=lambda events: any("first learner snapshot" in e for e in events),
    )
    assert "buffer 0, learner 0 on" in lost
    last = ds.isel(time=-1)
    assert int(last.learner_restarts) == int(last.buffer_restarts) == 1 and int(last.actor_restarts) == 2
    assert int(last.lost_episodes) == 16  # both actors were stopped for the rebuild
    # the replay did not go with the buffer: the new one started with the copy kept beside the
    # snapshot (about a second old), and only what came after that copy counts as lost
    restored, lost_replay = int(last.restored_replay), int(last.lost_replay)
    assert [e for e in events if f"its buffers start with {restored:,} transitions" in e], events
    rebuilt = int(np.argmax(ds.learner_restarts.values > 0))
    held = float(np.nanmax(ds.replay_size.values[: rebuilt + 1]))  # the lost buffer's last size
    assert restored > 0 and lost_replay < held, (restored, lost_replay, held)
    # rows go on showing the lost buffer's last size until the new one reports
    after = ds.replay_size.values[rebuilt:]
    reported = after[after != after[0]]
    assert reported.size and float(np.nanmin(reported)) >= restored, ds.replay_size.values
    # restored from a snapshot, at least the first one kept before the kill, not from nothing
    (first,) = [
        int(e.split("at update ")[1].rstrip(")").replace(",", "")) for e in events if "first learner snapshot" in e
    ]
    (went_on_from,) = [
        int(e.split("at update ")[1].replace(",", "")) for e in events if "goes on from its snapshot" in e
    ]
    assert 0 < first <= went_on_from and int(last.lost_updates) >= 0, (first, went_on_from)
    assert float(ds.param_version.values[-1]) > went_on_from


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_a_killed_data_parallel_rank_rebuilds_its_group_with_a_new_rendezvous(h, tmp_path):
    result, ds, lost, events = _run_with_a_kill(
        h,
        tmp_path,
        lambda plan: plan.learners[1].worker,
        lambda ds: went_on(ds, "learner_restarts", "updates") > 2000,
        "topology.actors=2",
        "topology.learners=2",
        "run.snapshot_interval=1",
        ready=lambda events: any("first learner snapshot" in e for e in events),
    )
    assert "buffer 1, learner 1 on" in lost
    last = ds.isel(time=-1)
    assert int(last.learner_restarts) == int(last.buffer_restarts) == 2 and int(last.actor_restarts) == 2


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_hosts_whose_worker_does_not_come_back_share_a_live_one(h, tmp_path, monkeypatch):
    """A nanny closed for good (as when a process dies while it starts, or a batch job is not
    replaced): after ``TAKEOVER_WAIT_S`` (2 s here) the lost actor shares the learner's worker
    and steps there."""
    from tianji_dask.runtime.cluster import worker_replacement
    from tianji_dask.runtime.cluster.cluster import local_cluster

    monkeypatch.setattr(worker_replacement, "TAKEOVER_WAIT_S", 2.0)
    cfg = load_config(
        "configs/cartpole_dqn.yaml", ["stop.target_return=null", "stop.max_env_steps=null", "stop.max_seconds=150"]
    )
    with local_cluster(2, dashboard=False) as cluster, Client(cluster) as client:
        events: list[str] = []
        with h.ending(train(cfg, client, out=tmp_path / "run", on_event=events.append)) as run:
            assert h.wait_until(lambda: run.recorder.tally.env_steps > 2000 or run.done, timeout=90)
            plan = place(scheduler_workers(client), cfg.topology, "any", cfg.seed)
            victim = plan.actors[0].worker
            (nanny,) = [n for n in cluster.workers.values() if n.worker_address == victim]
            cluster.sync(nanny.close)
            stepped = lambda: went_on(run.metrics(), "actor_restarts", "actor_env_steps", actor=0) > 1000  # noqa: E731
            assert h.wait_until(lambda: stepped() or run.done, timeout=120), events
            run.stop()
            result = run.wait(timeout=60)
    assert result is not None and result.status == "stopped", (result, events)
    shared = [e for e in events if "its hosts share" in e]
    assert len(shared) == 1 and plan.learners[0].worker in shared[0], events
    assert int(run.metrics().actor_restarts.values[-1]) == 1


# ------------------------------------------------------------------ the parts


def _lost(address: str, *hosts) -> LostWorker:
    return LostWorker(address, tuple(hosts), "; Dask's nanny: Worker process 7 was killed by signal 9")


def test_the_restart_policy_admits_max_restarts_per_window_and_then_names_every_loss():
    policy = RestartPolicy(max_restarts=2, window_s=60)
    policy.admit([_lost("tcp://a:1", ("actor", 0))], now=0)
    policy.admit([_lost("tcp://b:1", ("buffer", 0), ("learner", 0))], now=10)
    with pytest.raises(HostLost) as exc:
        policy.admit([_lost("tcp://c:1", ("actor", 1))], now=20)
    text = str(exc.value)
    assert "actor 1 on tcp://c:1: its worker left the cluster" in text
    assert "run.max_restarts=2, run.restart_window_s=60" in text
    assert "20 s ago: actor 0 on tcp://a:1" in text and "10 s ago: buffer 0, learner 0 on tcp://b:1" in text
    # the window slides: the first loss is forgotten after 60 s
    RestartPolicy(2, 60).admit([_lost("tcp://a:1", ("actor", 0))], now=0)
    later = RestartPolicy(1, 60)
    later.admit([_lost("tcp://a:1", ("actor", 0))], now=0)
    later.admit([_lost("tcp://a:1", ("actor", 0))], now=61)
    with pytest.raises(HostLost, match=r"run.max_restarts=0: a lost host fails the run"):
        RestartPolicy(0, 60).admit([_lost("tcp://a:1", ("actor", 0))], now=0)


def test_what_a_lost_host_takes_with_it_comes_from_its_last_heartbeat():
    assert lost_with("actor", {"unsent": 96, "env_steps": 5000}, num_envs=8) == {
        "lost_env_steps": 96,
        "lost_episodes": 8,
    }
    assert lost_with("buffer", {"size": 12345.0}, num_envs=8) == {"lost_replay": 12345}
    assert lost_with("learner", {"updates": 10}, num_envs=8) == {}


def test_a_rebuilt_buffer_loses_only_what_it_received_after_its_kept_replay():
    from tianji_dask.roles.buffer import ReplayMemory

    memory = ReplayMemory(100, (1,))
    kept = memory.state()
    kept.values["received"] = 3000  # the buffer had received 3,000 transitions when it was copied
    hb = {"incarnation": 1, "counters": {"size": 100.0, "received": 3070}}
    assert replay_lost(hb, None) == {"lost_replay": 100}  # nothing kept: all it held
    assert replay_lost(hb, (kept, 1)) == {"lost_replay": 70}  # the 70 received after the copy
    assert replay_lost({**hb, "counters": {"size": 50.0, "received": 3070}}, (kept, 1)) == {"lost_replay": 50}
    # a copy of the previous incarnation (restored into this one): all this one received
    assert replay_lost({**hb, "counters": {"size": 100.0, "received": 40}}, (kept, 0)) == {"lost_replay": 40}
    assert replay_lost({}, (kept, 0)) == {"lost_replay": 0}


def test_the_placement_moves_every_host_and_address_of_a_lost_worker():
    from types import SimpleNamespace

    workers = {f"tcp://h:{p}": {"name": str(p)} for p in (1, 2, 3, 4, 5, 6)}
    topology = SimpleNamespace(groups=2, learners=1, actors=2)
    plan = place(workers, topology, "r", 0)
    lead1 = plan.learners[1].worker
    after = moved(plan, lead1, "tcp://new:9")
    assert after.learners[1].worker == "tcp://new:9"
    assert all(a.buffer_worker == "tcp://new:9" for a in after.actors if a.group == 1)
    assert ("tcp://new:9", "gossip-r-1-from-0") in [tuple(x) for x in after.learners[0].gossip["publish_to"]]
    # everything else stays where it was
    assert [p.worker for p in after.actors] == [p.worker for p in plan.actors]
    assert after.learners[0].worker == plan.learners[0].worker
    assert lead1 not in str(after)


def test_a_new_incarnation_carries_the_totals_even_when_its_counters_are_already_higher():
    m = MetricsRecorder(run_name="r", target_return=None, config_json="{}", t0=0.0)
    m.add(Heartbeat("actor", 0, ActorCounters(env_steps=100, messages_sent=3), t=1.0).message())
    # re-created: its counters began at 0 and grew past the old ones before its first beat
    m.add({**Heartbeat("actor", 0, ActorCounters(env_steps=150, messages_sent=5), t=2.0).message(), "incarnation": 1})
    assert m.tally.env_steps == 250
    # a late heartbeat of the lost incarnation changes nothing
    m.add(Heartbeat("actor", 0, ActorCounters(env_steps=120, messages_sent=4), t=1.5).message())
    assert m.tally.env_steps == 250
    m.record_losses(actor_restarts=1, lost_episodes=8)
    row = m.row(3.0)
    assert row["actor_restarts"] == 1 and row["lost_episodes"] == 8 and row["lost_replay"] == 0
    with pytest.raises(ValueError, match="unknown loss counts"):
        m.record_losses(restarts=1)
