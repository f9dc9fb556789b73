"""The heartbeat schema: real roles report exactly their counters dataclass, and the recorder's
tables (growing counters, rates) follow from it."""

import dataclasses
import json
import time

import pytest

from tianji_dask.config import load_config
from tianji_dask.results.recorder import MetricsRecorder
from tianji_dask.roles.heartbeats import COUNTERS, ROLES, Heartbeat, growing_counters, rates
from tianji_dask.runtime.serial import SerialRun


@pytest.mark.timeout(60)
@pytest.mark.parametrize("algo", ["dqn", "ppo"])
def test_real_roles_report_their_counters_dataclass(h, algo):
    cfg = load_config(h.ROOT / "configs" / f"cartpole_{algo}.yaml", ["run.metrics_interval=0.2"])
    run = SerialRun(cfg)
    beats = []
    stop_at = time.monotonic() + 1.5
    run.run(beats.append, lambda: time.monotonic() > stop_at)
    by_role = {hb["role"]: hb for hb in beats}
    assert sorted(by_role) == sorted(ROLES)
    roles = {"actor": run.actor, "buffer": run.buffer, "learner": run.learner}
    for role, hb in by_role.items():
        declared = COUNTERS[role]
        kept = type(getattr(roles[role], "counters", None) or declared())
        assert issubclass(kept, declared), (role, kept)
        assert set(hb["counters"]) == {f.name for f in dataclasses.fields(kept)}, role
        assert all(isinstance(v, int | float) for v in hb["counters"].values()), hb["counters"]
        json.dumps(hb)  # plain data, as Worker.log_event sends it
    assert by_role["actor"]["counters"]["env_steps"] > 0 and by_role["buffer"]["counters"]["received"] > 0


@pytest.mark.parametrize("role", ROLES)
def test_recorder_carries_every_growing_counter_across_a_restart(role):
    m = MetricsRecorder(run_name="r", target_return=None, config_json="{}", t0=0.0)
    grown = {k: 100 for k in growing_counters(role)}
    m.add(Heartbeat(role, 0, COUNTERS[role](**grown), t=1.0).message())
    m.add(Heartbeat(role, 0, COUNTERS[role](**{k: 10 for k in grown}), t=2.0).message())  # began again
    assert {k: m.tally.host_total(role, 0, k) for k in grown} == {k: 110 for k in grown}


@pytest.mark.parametrize("role", ROLES)
def test_recorder_derives_each_declared_rate(role):
    m = MetricsRecorder(run_name="r", target_return=None, config_json="{}", t0=0.0)
    m.add(Heartbeat(role, 0, COUNTERS[role](), t=1.0).message())
    m.row(1.0)
    m.add(Heartbeat(role, 0, COUNTERS[role](**{c: 50 for c in rates(role).values()}), t=3.0).message())
    row = m.row(3.0)
    assert rates(role), role
    for name in rates(role):
        assert row[name] == pytest.approx(25.0), (role, name, row)
