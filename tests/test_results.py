"""Unit tests of results (MetricsRecorder, NetCDF), checkpoints and run directories. No cluster."""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr

from tianji_dask.results import checkpoint as ckpt_mod
from tianji_dask.results.atomic import atomic_write
from tianji_dask.results.checkpoint import (
    FORMAT_VERSION,
    CheckpointError,
    load_checkpoint,
    pack_state,
    save_checkpoint,
    unpack_state,
)
from tianji_dask.results.provenance import git_commit
from tianji_dask.results.recorder import MetricsRecorder
from tianji_dask.results.rundir import RunDirExists, prepare_run_dir, run_name, write_config

T0 = 1_700_000_000.0


def recorder(target=None, **kw) -> MetricsRecorder:
    return MetricsRecorder(
        run_name="test-run",
        target_return=target,
        config_json=json.dumps({"algo": {"name": "dqn", "lr": 1e-3}}),
        t0=T0,
        **kw,
    )


def actor(i, t, env_steps, *, version=0, episodes=(), **c):
    counters = {
        "env_steps": env_steps,
        "messages_sent": env_steps // 100,
        "bytes_sent": env_steps * 10,
        "dropped": 0,
        "blocked_s": 0.0,
        "throttled_s": 0.0,
        "param_version": version,
        "params_received": 1,
        "epsilon": 0.1,
        **c,
    }
    return {"role": "actor", "id": i, "t": T0 + t, "counters": counters, "episodes": list(episodes)}


def buffer(t, received, size=None, capacity=10_000, seq_gaps=0):
    return {
        "role": "buffer",
        "id": 0,
        "t": T0 + t,
        "episodes": [],
        "counters": {
            "received": received,
            "received_bytes": received * 10,
            "size": received if size is None else size,
            "capacity": capacity,
            "seq_gaps": seq_gaps,
        },
    }


def learner(t, updates, batch=32, version=0, loss=float("nan"), q=float("nan"), throttled=0.0, train_s=0.0):
    return {
        "role": "learner",
        "id": 0,
        "t": T0 + t,
        "episodes": [],
        "counters": {
            "updates": updates,
            "samples": updates * batch,
            "param_version": version,
            "throttled_s": throttled,
            "train_s": train_s,
            "loss": loss,
            "q_mean": q,
        },
    }


def feed_group(m: MetricsRecorder) -> None:
    """Two actors, one buffer, one learner: a start heartbeat and one 0.5 s later."""
    for hb in (actor(0, 0.0, 0), actor(1, 0.0, 0), buffer(0.0, 0), learner(0.0, 0)):
        m.add(hb)
    m.add(actor(0, 0.5, 1000, version=8, blocked_s=0.25, throttled_s=0.5, dropped=2))
    m.add(actor(1, 0.5, 500, version=6, blocked_s=0.75))
    m.add(buffer(0.5, 1400, seq_gaps=1))
    m.add(learner(0.5, 10, version=10, loss=0.5, q=2.0, throttled=0.125, train_s=0.1))


# ------------------------------------------------------------------ recorder
def test_rates_sums_and_ratios():
    m = recorder()
    feed_group(m)
    r = m.row(1.0)
    assert r["time"] == 1.0
    assert r["env_steps"] == 1500 == m.tally.env_steps
    assert r["env_fps"] == pytest.approx(3000.0)  # 1000/0.5 + 500/0.5
    assert r["receive_fps"] == pytest.approx(2800.0)
    assert r["train_fps"] == pytest.approx(640.0)  # 20 updates/s * 32
    assert r["train_s"] == pytest.approx(0.1)
    assert r["train_busy"] == pytest.approx(0.2)  # 0.1 s of updates in 0.5 s
    assert r["train_fps_in_updates"] == pytest.approx(3200.0)  # 320 samples in 0.1 s of updates
    assert r["updates"] == 10
    assert r["replay_ratio"] == pytest.approx(320 / 1400)
    assert r["replay_fill"] == pytest.approx(0.14)
    assert r["param_version"] == 10
    assert r["policy_lag"] == pytest.approx(3.0)  # 10 - mean(8, 6)
    assert (r["loss"], r["q_mean"]) == (0.5, 2.0)
    assert r["blocked_s"] == pytest.approx(1.0)
    assert r["throttled_actor_s"] == pytest.approx(0.5)
    assert r["throttled_learner_s"] == pytest.approx(0.125)
    assert (r["dropped"], r["seq_gaps"]) == (2, 1)

    ds = m.dataset()
    assert ds.sizes == {"time": 1, "actor": 2, "buffer": 1, "learner": 1, "evaluation": 0}
    np.testing.assert_allclose(ds.actor_env_fps.sel(time=1.0).values, [2000.0, 1000.0])
    np.testing.assert_allclose(ds.actor_env_steps.values, [[1000.0, 500.0]])
    np.testing.assert_allclose(ds.actor_param_version.values, [[8.0, 6.0]])
    np.testing.assert_allclose(ds.buffer_receive_fps.values, [[2800.0]])
    np.testing.assert_allclose(ds.learner_train_fps.values, [[640.0]])
    assert ds.env_steps.dtype == np.int64


def test_rate_uses_interval_between_rows_and_heartbeat_time():
    m = recorder()
    m.add(actor(0, 0.0, 0))
    assert math.isnan(m.row(0.1)["env_fps"])  # one heartbeat: no rate yet
    m.add(actor(0, 0.5, 1000))
    assert m.row(0.6)["env_fps"] == pytest.approx(2000.0)
    # No new heartbeat since the previous row (zero interval): keep the last rate, no division by 0.
    assert m.row(0.7)["env_fps"] == pytest.approx(2000.0)
    m.add(actor(0, 1.5, 1500))  # 500 steps over 1.0 s of heartbeat time, whatever the row times
    assert m.row(5.0)["env_fps"] == pytest.approx(500.0)
    # An out-of-order (older) heartbeat must not move the counters backwards.
    m.add(actor(0, 1.0, 1200))
    assert m.tally.env_steps == 1500
    np.testing.assert_allclose(m.dataset().env_fps.values, [np.nan, 2000, 2000, 500])


def test_restarted_host_keeps_totals_monotone():
    m = recorder()
    m.add(actor(0, 0.0, 0))
    m.add(actor(0, 1.0, 1000))
    m.row(1.0)
    m.add(actor(0, 2.0, 300))  # host restarted: counters began again at 0
    r = m.row(2.0)
    assert r["env_steps"] == 1300
    assert r["env_fps"] == pytest.approx(300.0)


def test_unpublished_param_version_is_missing_not_minus_one():
    m = recorder()
    m.add(actor(0, 0.0, 0, version=-1))
    m.add(actor(1, 0.0, 0, version=4))
    m.add(learner(0.0, 0, version=5))
    r = m.row(0.0)
    assert r["policy_lag"] == pytest.approx(1.0)
    assert math.isnan(m.dataset().actor_param_version.values[0, 0])


def test_policy_lag_is_never_negative_when_actors_report_after_the_learner():
    # the learner's last heartbeat says 100; since then it published 150, which both actors use
    m = recorder()
    m.add(learner(0.0, 0, version=100))
    m.add(actor(0, 0.4, 0, version=150))
    m.add(actor(1, 0.4, 0, version=100))
    r = m.row(0.5)
    assert r["param_version"] == 150
    assert r["policy_lag"] == pytest.approx(25.0)


def test_policy_lag_compares_versions_at_the_same_time():
    # the learner makes 800 updates/s; the actor's beat (0.5 s, version 400) falls between the
    # learner's beats at 0 and 1.0 s: the learner was at 400 then, so the actor was up to date,
    # although the learner's latest beat says 800
    m = recorder()
    m.add(learner(0.0, 0, version=0))
    m.add(learner(1.0, 800, version=800))
    m.add(actor(0, 0.5, 1000, version=400))
    assert m.row(1.0)["policy_lag"] == pytest.approx(0.0)
    m.add(actor(0, 1.5, 2000, version=600))  # after the learner's last beat: compared with 800
    assert m.row(1.5)["policy_lag"] == pytest.approx(200.0)


def test_policy_lag_compares_each_actor_with_its_own_groups_learner():
    m = MetricsRecorder(
        run_name="g",
        target_return=None,
        t0=T0,
        config_json=json.dumps({"algo": {"name": "ppo"}, "topology": {"groups": 2, "actors": 1, "learners": 1}}),
    )
    learner_of = lambda g, t, v: {**learner(t, v, version=v), "id": g}  # noqa: E731
    m.add(learner_of(0, 0.0, 10))
    m.add(learner_of(1, 0.0, 500))  # group 1 counts its own versions
    m.add(actor(0, 0.1, 100, version=9))
    m.add(actor(1, 0.1, 100, version=498))
    assert m.row(0.2)["policy_lag"] == pytest.approx((1 + 2) / 2)


def test_empty_recorder_reports_nan_and_zero():
    m = recorder()
    r = m.row(0.0)
    assert r["env_steps"] == 0 and r["updates"] == 0
    for k in (
        "env_fps",
        "receive_fps",
        "train_fps",
        "return_mean_100",
        "replay_ratio",
        "replay_fill",
        "param_version",
        "policy_lag",
        "loss",
    ):
        assert math.isnan(r[k]), k
    assert math.isnan(m.tally.return_mean_100) and m.tally.episodes == 0


def test_return_mean_100_over_more_than_100_episodes():
    m = recorder()
    eps = [[float(i), 10 + i, T0 + 0.01 * i] for i in range(150)]
    m.add(actor(0, 0.5, 100, episodes=eps[:70]))
    m.add(actor(1, 0.6, 100, episodes=eps[70:]))
    assert m.tally.episodes == 150
    assert m.tally.return_mean_100 == pytest.approx(np.mean(np.arange(50, 150)))  # 99.5
    assert m.row(1.0)["return_mean_100"] == pytest.approx(99.5)
    e = m.episodes_dataset()
    assert e.sizes["episode"] == 150
    np.testing.assert_array_equal(e["return"].values, np.arange(150.0))
    np.testing.assert_array_equal(e["length"].values, 10 + np.arange(150))
    np.testing.assert_array_equal(e["actor"].values, [0] * 70 + [1] * 80)
    np.testing.assert_allclose(e["wall_time"].values, 0.01 * np.arange(150), atol=1e-6)
    assert e["env_steps"].values[-1] == 200


def test_time_to_target_set_when_first_reached():
    m = recorder(target=50.0)
    eps = [[float(i), 10, T0 + 2.0 + i] for i in range(130)]
    m.add(actor(0, 200.0, 1000, episodes=eps))
    # After 100 episodes (0..99) the mean is 49.5; episode 100 makes the window 1..100: 50.5.
    assert m.tally.time_to_target_s == pytest.approx(2.0 + 100)
    m.row(201.0)
    ds = m.dataset()
    assert ds.attrs["time_to_target_s"] == pytest.approx(102.0)
    assert ds.attrs["target_return"] == 50.0


def test_time_to_target_needs_100_episodes_and_stays_nan_without_target():
    m = recorder(target=0.0)
    m.add(actor(0, 1.0, 10, episodes=[[10.0, 5, T0 + 1.0]] * 99))
    assert math.isnan(m.tally.time_to_target_s)
    m.add(actor(0, 2.0, 20, episodes=[[10.0, 5, T0 + 1.5]]))
    assert m.tally.time_to_target_s == pytest.approx(1.5)
    m2 = recorder(target=None)
    m2.add(actor(0, 1.0, 10, episodes=[[10.0, 5, T0 + 1.0]] * 200))
    assert math.isnan(m2.tally.time_to_target_s)
    assert math.isnan(m2.dataset().attrs["target_return"])


def test_a_heartbeat_of_an_unknown_role_is_refused():
    m = recorder()
    feed_group(m)
    with pytest.raises(ValueError, match="role"):
        m.add({"role": "planner", "id": 0, "t": T0, "counters": {}, "episodes": []})


def test_config_json_must_be_json():
    with pytest.raises(ValueError, match="config_json"):
        MetricsRecorder(run_name="x", target_return=None, config_json="{not json", t0=T0)
    with pytest.raises(TypeError, match="config_json"):
        MetricsRecorder(run_name="x", target_return=None, config_json={"a": 1}, t0=T0)


def test_every_variable_has_long_name_and_units():
    m = recorder()
    feed_group(m)
    m.add(actor(0, 0.6, 1100, episodes=[[1.0, 3, T0 + 0.6]]))
    m.row(1.0)
    required = {
        "env_steps",
        "env_fps",
        "receive_fps",
        "train_fps",
        "updates",
        "return_mean_100",
        "replay_ratio",
        "replay_fill",
        "param_version",
        "policy_lag",
        "loss",
        "q_mean",
        "blocked_s",
        "throttled_actor_s",
        "throttled_learner_s",
        "train_s",
        "train_fps_in_updates",
        "dropped",
        "seq_gaps",
        "actor_env_fps",
        "actor_env_steps",
        "actor_param_version",
        "learner_train_fps",
        "buffer_receive_fps",
    }
    ds, eps = m.dataset(), m.episodes_dataset()
    assert required <= set(ds.data_vars)
    assert {"return", "length", "actor", "wall_time"} <= set(eps.data_vars)
    assert ds.time.attrs == {"long_name": "wall time since start", "units": "s"}
    for d in (ds, eps):
        for name, var in d.variables.items():
            assert var.attrs.get("long_name") and "units" in var.attrs, name
    for key in (
        "run_name",
        "target_return",
        "time_to_target_s",
        "config_json",
        "tianji_dask_version",
        "torch_version",
        "dask_version",
        "distributed_version",
        "gymnasium_version",
        "numpy_version",
        "xarray_version",
        "python_version",
        "git_commit",
        "created",
        "status",
        "error",
    ):
        assert key in ds.attrs and key in eps.attrs, key
    assert json.loads(ds.attrs["config_json"]) == {"algo": {"name": "dqn", "lr": 1e-3}}


def test_status_is_running_until_the_outcome_is_set(tmp_path):
    m = recorder(attrs={"mode": "serial"})
    feed_group(m)
    m.row(1.0)
    m.write(tmp_path)
    for name in ("metrics.nc", "episodes.nc"):
        with xr.open_dataset(tmp_path / name) as ds:
            assert (ds.attrs["status"], ds.attrs["error"]) == ("running", ""), name
    m.set_outcome("failed", "RuntimeError('boom')")
    assert (m.dataset().attrs["status"], m.episodes_dataset().attrs["error"]) == ("failed", "RuntimeError('boom')")
    m.write(tmp_path)
    for name in ("metrics.nc", "episodes.nc"):
        with xr.open_dataset(tmp_path / name) as ds:
            assert (ds.attrs["status"], ds.attrs["error"]) == ("failed", "RuntimeError('boom')"), name
    m.set_outcome("stopped", None)  # no error is an empty string: netCDF cannot store None
    assert m.dataset().attrs["error"] == ""


def _assert_same(loaded: xr.Dataset, ds: xr.Dataset) -> None:
    xr.testing.assert_equal(loaded, ds)
    for name in ds.variables:
        assert loaded[name].dtype == ds[name].dtype, name
        assert loaded[name].attrs == ds[name].attrs, name
    assert set(loaded.attrs) == set(ds.attrs)
    for k, v in ds.attrs.items():
        if k == "created":
            continue
        w = loaded.attrs[k]
        if isinstance(v, float) and math.isnan(v):
            assert math.isnan(w), k
        else:
            assert w == v, k


def test_netcdf_round_trip(tmp_path):
    m = recorder(
        target=1.0, attrs={"env_id": "CartPole-v1", "seed": 3, "note": None, "plan": {"actors": 2}, "serial": False}
    )
    feed_group(m)
    m.add(actor(0, 0.7, 1200, episodes=[[1.5, 20, T0 + 0.7], [2.5, 30, T0 + 0.71]]))
    m.row(0.8)
    m.add(actor(2, 0.9, 10))  # a host that joins later: NaN before it appears
    m.row(1.0)
    m.write(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["episodes.nc", "metrics.nc"]
    with xr.open_dataset(tmp_path / "metrics.nc") as loaded:
        loaded.load()
    _assert_same(loaded, m.dataset())
    assert loaded.sizes["actor"] == 3 and math.isnan(loaded.actor_env_steps.values[0, 2])
    assert loaded.attrs["env_id"] == "CartPole-v1" and loaded.attrs["seed"] == 3
    assert "note" not in loaded.attrs and json.loads(loaded.attrs["plan"]) == {"actors": 2}
    with xr.open_dataset(tmp_path / "episodes.nc") as eps:
        eps.load()
    _assert_same(eps, m.episodes_dataset())
    # Writing again replaces the files (the run rewrites them periodically) and leaves no temp files.
    m.row(2.0)
    m.write(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["episodes.nc", "metrics.nc"]
    with xr.open_dataset(tmp_path / "metrics.nc") as loaded:
        assert loaded.sizes["time"] == 3


def test_empty_datasets_write(tmp_path):
    m = recorder()
    m.write(tmp_path)
    with xr.open_dataset(tmp_path / "metrics.nc") as ds:
        assert ds.sizes["time"] == 0 and ds.sizes["actor"] == 0
        assert "env_fps" in ds and ds.attrs["run_name"] == "test-run"
    with xr.open_dataset(tmp_path / "episodes.nc") as eps:
        assert eps.sizes["episode"] == 0 and "return" in eps


def test_results_write_in_a_process_whose_dask_config_names_a_closed_client(tmp_path):
    """A Client that failed to connect (or was closed) can leave Dask's config naming the
    distributed scheduler; the run's files are still written."""
    import dask
    from distributed import Client

    with pytest.raises(OSError):  # nothing listens there: the Client's start fails
        Client("tcp://127.0.0.1:1", timeout="1s")
    m = recorder()
    with dask.config.set(scheduler="dask.distributed"):  # as such a Client can leave it
        m.write(tmp_path)
        assert dask.config.get("scheduler") == "dask.distributed"  # put back after the write
    with xr.open_dataset(tmp_path / "metrics.nc") as ds:
        assert ds.attrs["run_name"] == "test-run"


def test_concurrent_add_and_row():
    m = recorder()
    n = 300

    def feed(i):
        for k in range(1, n + 1):
            m.add(actor(i, 0.01 * k, 10 * k, episodes=[[1.0, 10, T0 + 0.01 * k]]))

    threads = [threading.Thread(target=feed, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    while any(th.is_alive() for th in threads):
        m.row()
    for th in threads:
        th.join()
    assert m.row()["env_steps"] == 4 * 10 * n
    assert m.tally.episodes == 4 * n
    m.dataset()


def test_git_commit_format_and_missing_git(monkeypatch, tmp_path):
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?|unknown", git_commit())
    monkeypatch.setenv("PATH", str(tmp_path))  # no git executable anywhere
    assert git_commit() == "unknown"


def test_git_commit_is_dirty_for_a_changed_tracked_file_not_an_untracked_one(tmp_path):
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tmp_path), *args], capture_output=True, text=True, check=True).stdout

    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", "pkg/__init__.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one file")
    sha = git("rev-parse", "HEAD").strip()
    assert git_commit(pkg) == sha
    (tmp_path / "eval.nc").write_bytes(b"a run's output left in the checkout")
    (pkg / "episode.mp4").write_bytes(b"")
    assert git_commit(pkg) == sha
    (pkg / "__init__.py").write_text("x = 2\n")
    assert git_commit(pkg) == sha + "-dirty"


# ---------------------------------------------------------------- checkpoints
def _state(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "q_net": {"w": torch.randn(4, 3, generator=g, requires_grad=True), "b": torch.zeros(3)},
        "optimizer": {"step": torch.tensor(7, dtype=torch.int64), "mask": torch.tensor([True, False])},
    }


def _assert_state_equal(a, b):
    assert a.keys() == b.keys()
    for comp in a:
        assert a[comp].keys() == b[comp].keys()
        for k in a[comp]:
            assert torch.equal(a[comp][k].detach(), b[comp][k]), (comp, k)


def test_checkpoint_round_trip(tmp_path):
    d = tmp_path / "run" / "checkpoint"
    state = _state()
    assert save_checkpoint(d, state, {"env_steps": 1234, "config": {"lr": 1e-3}}) == d
    assert sorted(p.name for p in d.iterdir()) == ["checkpoint.json", "tensors.pt"]
    loaded, meta = load_checkpoint(d)
    _assert_state_equal(state, loaded)
    assert meta["format_version"] == FORMAT_VERSION == 1
    assert meta["env_steps"] == 1234 and meta["config"] == {"lr": 1e-3}
    assert meta["torch_version"] == torch.__version__ and "created" in meta
    assert "tianji_dask_version" in meta
    # tensors.pt holds only plain containers of tensors: a weights-only load of the raw file works.
    raw = torch.load(d / "tensors.pt", weights_only=True)
    assert type(raw) is dict and type(raw["q_net"]) is dict


def test_a_packed_state_is_saved_as_the_state_itself(tmp_path):
    """What a learner sends the driver (pack_state's bytes) makes the same checkpoint as its
    state, and unpacks to it."""
    state = _state(3)
    packed = pack_state(state)
    assert isinstance(packed, bytes)
    _assert_state_equal(state, unpack_state(packed))
    save_checkpoint(tmp_path / "from_state", state, {"n": 1})
    save_checkpoint(tmp_path / "from_bytes", packed, {"n": 1})
    assert (tmp_path / "from_bytes" / "tensors.pt").read_bytes() == packed
    _assert_state_equal(load_checkpoint(tmp_path / "from_state")[0], load_checkpoint(tmp_path / "from_bytes")[0])
    with pytest.raises(TypeError, match="torch.Tensor"):
        pack_state({"net": {"w": np.zeros(2)}})


def test_checkpoint_replaces_previous_and_leaves_no_temp(tmp_path):
    d = tmp_path / "checkpoint"
    save_checkpoint(d, _state(0), {"n": 1})
    save_checkpoint(d, _state(1), {"n": 2})
    loaded, meta = load_checkpoint(d)
    assert meta["n"] == 2
    _assert_state_equal(_state(1), loaded)
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint"]


def test_checkpoint_format_version_mismatch(tmp_path):
    d = save_checkpoint(tmp_path / "checkpoint", _state(), {})
    meta = json.loads((d / "checkpoint.json").read_text())
    meta["format_version"] = 2
    (d / "checkpoint.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="format_version 2.*reads format_version 1"):
        load_checkpoint(d)


def test_checkpoint_missing_dir_or_file(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint directory"):
        load_checkpoint(tmp_path / "nope")
    d = save_checkpoint(tmp_path / "checkpoint", _state(), {})
    (d / "tensors.pt").unlink()
    with pytest.raises(CheckpointError, match="tensors.pt is missing"):
        load_checkpoint(d)


def test_interrupted_save_keeps_previous_checkpoint(tmp_path, monkeypatch):
    d = tmp_path / "checkpoint"
    save_checkpoint(d, _state(0), {"n": 1})

    write = ckpt_mod._write_file

    def failing_write(path, what):
        if path.name != "tensors.pt":
            return write(path, what)
        path.with_name(".tensors.pt.tmp").write_bytes(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(ckpt_mod, "_write_file", failing_write)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(d, _state(1), {"n": 2})
    monkeypatch.undo()
    loaded, meta = load_checkpoint(d)
    assert meta["n"] == 1
    _assert_state_equal(_state(0), loaded)
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint"]


def test_crash_between_renames_is_recoverable(tmp_path):
    d = save_checkpoint(tmp_path / "checkpoint", _state(0), {"n": 1})
    old = tmp_path / ".checkpoint.old-abc"
    d.rename(old)  # as if the process died after moving the old checkpoint aside
    with pytest.raises(CheckpointError, match=r"\.checkpoint\.old-abc"):
        load_checkpoint(d)
    save_checkpoint(d, _state(1), {"n": 2})  # tidies up, then saves
    assert load_checkpoint(d)[1]["n"] == 2
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint"]


def test_checkpoint_rejects_bad_input(tmp_path):
    with pytest.raises(ValueError, match="reserved"):
        save_checkpoint(tmp_path / "c", _state(), {"format_version": 9})
    with pytest.raises(TypeError, match="torch.Tensor"):
        save_checkpoint(tmp_path / "c", {"net": {"w": np.zeros(2)}}, {})
    with pytest.raises(TypeError, match="JSON"):
        save_checkpoint(tmp_path / "c", _state(), {"when": dt.datetime.now()})
    assert not (tmp_path / "c").exists()


# --------------------------------------------------------------- run dirs
def test_run_name():
    when = dt.datetime(2026, 1, 2, 3, 4, 5)
    assert run_name("ALE/Pong-v5", "dqn", 1, when) == "ALE-Pong-v5__dqn__1__20260102-030405"
    assert run_name("My Env:v0", "ppo/new", 42, when) == "My-Env-v0__ppo-new__42__20260102-030405"
    assert re.fullmatch(r"CartPole-v1__dqn__0__\d{8}-\d{6}", run_name("CartPole-v1", "dqn", 0))


def test_prepare_run_dir_default_suffixes(tmp_path):
    root = tmp_path / "runs"
    a = prepare_run_dir(None, root=root, name="CartPole-v1__dqn__0__20260102-030405")
    b = prepare_run_dir(None, root=root, name="CartPole-v1__dqn__0__20260102-030405")
    c = prepare_run_dir(None, root=root, name="CartPole-v1__dqn__0__20260102-030405")
    assert [a.name, b.name, c.name] == [
        "CartPole-v1__dqn__0__20260102-030405",
        "CartPole-v1__dqn__0__20260102-030405-2",
        "CartPole-v1__dqn__0__20260102-030405-3",
    ]
    assert all(p.is_dir() and p.is_absolute() for p in (a, b, c))


def test_prepare_run_dir_out(tmp_path):
    new = prepare_run_dir(tmp_path / "a" / "b", name="ignored")
    assert new == (tmp_path / "a" / "b").absolute() and new.is_dir()
    assert prepare_run_dir(new, name="x") == new  # existing but empty: fine
    (new / "metrics.nc").write_bytes(b"earlier results")
    with pytest.raises(RunDirExists, match=r"(?s)not empty.*--out.*remove") as e:
        prepare_run_dir(new, name="x")
    assert isinstance(e.value, ValueError) and str(new) in str(e.value)
    assert (new / "metrics.nc").read_bytes() == b"earlier results"
    with pytest.raises(RunDirExists, match="file"):
        prepare_run_dir(new / "metrics.nc", name="x")


def test_write_config(tmp_path):
    write_config(tmp_path, "algo:\n  name: dqn")
    assert (tmp_path / "config.yaml").read_text() == "algo:\n  name: dqn\n"
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]


def test_an_atomic_write_replaces_the_file_only_with_a_complete_one(tmp_path):
    path = tmp_path / "plan.yaml"
    path.write_text("old")
    with pytest.raises(OSError, match="disk full"), atomic_write(path) as tmp:
        tmp.write_text("half")
        raise OSError("disk full")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["plan.yaml"]
    with atomic_write(path, suffix=".mp4") as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".plan.yaml.") and tmp.suffix == ".mp4"
        tmp.write_text("new")
    assert path.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["plan.yaml"]


def test_an_atomic_write_asked_to_fsync_flushes_the_file_before_the_rename(tmp_path, monkeypatch):
    import os

    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}")) or real_fsync(fd))
    with atomic_write(tmp_path / "a") as tmp:
        tmp.write_text("a")
    assert synced == []
    with atomic_write(tmp_path / "b", fsync=True) as tmp:
        tmp.write_text("b")
    assert synced == [str(tmp)] and (tmp_path / "b").read_text() == "b"


def test_netcdf_files_written_together_are_replaced_together_or_not_at_all(tmp_path):
    from tianji_dask.results.recorder import write_netcdf_files_atomic

    a, b = tmp_path / "a.nc", tmp_path / "b.nc"
    ds = xr.Dataset({"v": ("time", np.arange(3.0))})
    write_netcdf_files_atomic({a: ds, b: ds})
    with pytest.raises(AttributeError):
        write_netcdf_files_atomic({a: ds * 2, b: object()})  # its write fails: not a Dataset
    assert xr.load_dataset(a)["v"].values.tolist() == [0.0, 1.0, 2.0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.nc", "b.nc"]


def test_missing_or_none_counters_do_not_break_rows():
    m = recorder()
    m.add({"role": "actor", "id": 0, "t": T0, "counters": {"env_steps": 100}, "episodes": []})
    m.add({"role": "actor", "id": 0, "t": T0 + 1, "counters": {"env_steps": 200, "dropped": None}, "episodes": []})
    m.add({"role": "buffer", "id": 0, "t": T0 + 1, "counters": {}, "episodes": []})
    r = m.row(1.0)
    assert (r["env_steps"], r["dropped"], r["seq_gaps"]) == (200, 0, 0)
    assert r["env_fps"] == pytest.approx(100.0)
    assert math.isnan(r["replay_fill"]) and math.isnan(r["replay_ratio"])


WRITES_BESIDE_READS = """
import sys, threading, time
from pathlib import Path
import numpy as np, xarray as xr
from tianji_dask.results.recorder import write_netcdf_atomic
ds = xr.Dataset({f"v{i}": ("time", np.arange(2000.0) * i) for i in range(60)}, attrs={"a": "b"})
out = Path(sys.argv[1])
write_netcdf_atomic(ds, out / "read.nc")
stop = time.monotonic() + float(sys.argv[2])
def the_runs_writes():
    while time.monotonic() < stop:
        write_netcdf_atomic(ds, out / "written.nc")
writer = threading.Thread(target=the_runs_writes)
writer.start()
reads = 0
while time.monotonic() < stop:
    xr.load_dataset(out / "read.nc", engine="netcdf4")
    reads += 1
writer.join()
print(reads)
"""


@pytest.mark.slow
def test_the_runs_writes_beside_a_users_reads_in_the_same_process_do_not_crash_it(tmp_path):
    """A notebook opens run files with xarray (netCDF4, its default engine) while a run in the
    same kernel writes its results from its own thread: both libraries under netCDF4 crashed
    the process with a segmentation fault within seconds; the run writes through h5py's HDF5."""
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-c", WRITES_BESIDE_READS, str(tmp_path), "10"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert int(r.stdout) > 20


def test_evaluations_are_records_beside_the_rows_and_a_continued_run_keeps_them(tmp_path):
    m = recorder()
    feed_group(m)
    m.row(1.0)
    m.record_evaluation(mean=120.5, std=3.0, env_steps=10_000, t_rel=4.0)
    m.record_evaluation(mean=98.0, std=1.0, env_steps=20_000, t_rel=8.0)
    assert m.best_evaluation() == 120.5
    m.write(tmp_path)
    with xr.open_dataset(tmp_path / "metrics.nc") as first:
        first.load()
    assert first["eval_return_mean"].dims == ("evaluation",)
    assert first["eval_return_mean"].values.tolist() == [120.5, 98.0]
    assert first["eval_env_steps"].values.tolist() == [10_000, 20_000]
    for name in ("eval_return_mean", "eval_return_std", "eval_env_steps", "eval_time"):
        assert first[name].attrs["long_name"] and first[name].attrs["units"], name
    with xr.open_dataset(tmp_path / "episodes.nc") as eps:
        eps.load()
    later = recorder()
    later.continue_from(first, eps)
    later.record_evaluation(mean=130.0, std=0.0, env_steps=30_000, t_rel=2.0)
    ds = later.dataset()
    assert ds["eval_return_mean"].values.tolist() == [120.5, 98.0, 130.0]
    assert ds["eval_time"].values[-1] == first["time"].values[-1] + 2.0  # the continued run's clock goes on
    # files written before evaluations existed continue with the new ones alone
    older = recorder()
    older.continue_from(first.drop_vars(["eval_return_mean", "eval_return_std", "eval_env_steps", "eval_time"]), eps)
    older.record_evaluation(mean=1.0, std=0.0, env_steps=1, t_rel=0.0)
    assert older.dataset()["eval_return_mean"].values.tolist() == [1.0]


def test_portable_path_is_relative_below_the_working_directory_and_as_given_elsewhere(tmp_path, monkeypatch):
    from tianji_dask.results.provenance import portable_path

    monkeypatch.chdir(tmp_path)
    assert portable_path(tmp_path / "runs" / "a") == str(Path("runs") / "a")
    assert portable_path("runs/b") == str(Path("runs") / "b")
    outside = tmp_path.parent / "elsewhere"
    assert portable_path(outside) == str(outside)
