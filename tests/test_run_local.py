"""End-to-end runs on this machine: the Python API on a LocalCluster (its own and a given one),
the serial reference, another env by overrides only, and bad input through the CLI.

Each run is a few seconds of CartPole (or Acrobot) training; the checks are on what a run leaves
behind (docs/metrics.md is the contract) and on what it must not leave (processes, Dask actors,
threads, channels).
"""

from __future__ import annotations

import contextvars
import os
import re
import sys
import threading
import time

import cloudpickle
import dask
import psutil
import pytest
from conftest import FORK_SERVER, forked_local_cluster
from distributed import Client, LocalCluster

from tianji_dask.config import load_config
from tianji_dask.runtime.cluster.workers import scheduler_workers
from tianji_dask.runtime.driver import train

pytestmark = pytest.mark.integration

# Workers may not be able to import this test module: ship its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def short_config(h, *extra: str):
    return load_config(h.CONFIG, [*h.SHORT, *extra])


def children() -> set[int]:
    """Child processes of this one, except multiprocessing's resource tracker and the fork server
    of the runs' workers (tianji_dask.runtime.processes.fork_server), which live as long as this process once
    started (the first run of the process starts them)."""
    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            line = " ".join(p.cmdline())
            if "multiprocessing.resource_tracker" not in line and not (FORK_SERVER in line and p.ppid() == os.getpid()):
                out.add(p.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def tianji_leftovers(dask_worker) -> dict:
    """What a finished run may not leave on a worker (run inside it by ``client.run``)."""
    from tianji_dask.channels import ChannelService

    svc = ChannelService.installed(dask_worker)
    return {
        "actors": len(dask_worker.state.actors),
        "threads": sorted(t.name for t in threading.enumerate() if t.name.startswith("tianji-")),
        "channels": sorted(svc._inboxes) if svc is not None else [],
    }


def scheduler_leftovers(dask_scheduler) -> dict:
    """The run's traces on the scheduler (run by ``client.run_on_scheduler``). The heartbeat
    topic's log (at most ``distributed.admin.low-level-log-length`` entries) is reported, not
    judged: Dask keeps every topic's recent events by design."""
    return {
        "tasks": sorted(str(k) for k in dask_scheduler.tasks if "Host-" in str(k)),
        "events": sorted(str(k) for k in dask_scheduler.extensions["events"]._events if str(k).startswith("tianji-")),
        "topic_log": {
            t: len(dask_scheduler.get_events(t)) for t in dask_scheduler.get_events() if t.startswith("tianji-")
        },
    }


def clean(client) -> bool:
    return all(not any(v.values()) for v in client.run(tianji_leftovers).values())


# ------------------------------------------------------------------ the driver's own cluster
@pytest.fixture(scope="module")
def own_cluster_run(h, tmp_path_factory):
    """One run on the LocalCluster the driver starts, read by the tests below: with the worker
    check every 10 ms and the client refreshing its identity every 5 ms (the regression of
    :func:`test_the_worker_check_is_not_fooled_by_the_clients_refresh`). Its run, result, events,
    wall time and whether the cluster's processes were gone afterwards."""
    from tianji_dask.runtime.cluster import supervisor

    cfg = short_config(h, "stop.max_env_steps=6000")
    before = children()
    events: list[str] = []
    out = tmp_path_factory.mktemp("own") / "run"
    t = time.monotonic()
    with (
        pytest.MonkeyPatch.context() as mp,
        dask.config.set({"distributed.client.scheduler-info-interval": "5ms"}),
    ):
        mp.setattr(supervisor, "WORKER_CHECK_S", 0.01)
        run = train(cfg, out=out, on_event=events.append)
        result = run.wait(timeout=75)
    wall = time.monotonic() - t
    if result is None:
        run.stop()
        run.wait(timeout=30)
    gone = h.wait_until(lambda: children() <= before, timeout=5)
    return {
        "cfg": cfg,
        "out": out,
        "run": run,
        "result": result,
        "events": events,
        "wall": wall,
        "gone": gone,
        "left": children() - before,
    }


@pytest.mark.timeout(90)
def test_distributed_run_on_its_own_local_cluster(h, own_cluster_run):
    cfg, run, result, events = (own_cluster_run[k] for k in ("cfg", "run", "result", "events"))
    assert result is not None, "the run did not end"
    assert result.error is None, result.error
    assert result.status == "max_env_steps" and result.ok
    assert result.run_dir == own_cluster_run["out"].absolute()
    assert any(e.startswith("dashboard: http://127.0.0.1:") for e in events), events
    # where the start-up went: the cluster, the hosts' creation, each role's loop (and of that its
    # build), each said once
    (cluster,) = [e for e in events if re.fullmatch(r"LocalCluster of 2 workers started in [0-9.]+ s", e)]
    assert [e for e in events if re.fullmatch(r"3 hosts created and started in [0-9.]+ s", e)], events
    (ready,) = [e for e in events if e.startswith("hosts ready")]
    times = {
        role: (float(s), float(built), float(envs or 0))
        for role, s, built, envs in re.findall(
            r"(\w+ \d+) in ([0-9.]+) s \(built in ([0-9.]+) s(?:, its envs ([0-9.]+) s)?(?:, its prepare [0-9.]+ s)?\)",
            ready,
        )
    }
    assert times.keys() == {"actor 0", "buffer 0", "learner 0"}, ready
    assert all(0 <= envs <= built <= s < 60 for s, built, envs in times.values()), ready
    assert "actor 0 in" in ready and ", its envs " in ready.split("actor 0 in")[1].split(")")[0], ready
    assert ", its prepare " in ready.split("learner 0 in")[1].split(")")[0], ready

    n = h.check_run_dir(result.run_dir, cfg, mode="distributed")
    assert h.running_at_the_end(n), n["end_rates"]
    assert n["env_steps"] == result.env_steps > cfg.algo.learning_starts
    assert n["episodes"] > 0 and n["updates"] > 0
    assert n["obs_dim"] == 4 and n["n_actions"] == 2
    # the memory budget for CartPole: every host's worker process stays under 400 MB RSS
    ds = run.metrics()
    for var in ("actor_rss_mb", "buffer_rss_mb", "learner_rss_mb"):
        peak = float(ds[var].max())
        assert 100 < peak <= 400, (var, peak)
    # and reports its open files and threads: a worker has its listener, comms and Dask's threads
    for role in ("actor", "buffer", "learner"):
        fds, threads = float(ds[f"{role}_open_fds"].max()), float(ds[f"{role}_threads"].max())
        assert 5 <= fds < 1000 and 2 <= threads < 200, (role, fds, threads)
    # the driver closes the LocalCluster it started: its worker processes are gone
    assert own_cluster_run["gone"], own_cluster_run["left"]
    print(f"\nown cluster: wall {own_cluster_run['wall']:.1f} s (run {result.wall_s:.1f} s), {n}")


def test_the_worker_check_is_not_fooled_by_the_clients_refresh(own_cluster_run):
    """Regression: the driver read the client's cached identity, which the client's periodic
    refresh replaces with one listing no workers; a Pong DQN run on the GPU machine lost its
    buffer that way after 534 s. In the module's run the refresh runs every 5 ms and the check
    every 10 ms."""
    result = own_cluster_run["result"]
    assert result is not None and result.error is None, result and result.error
    assert result.status == "max_env_steps"


@pytest.mark.timeout(90)
def test_another_client_opened_while_the_hosts_start_and_closed_leaves_the_run_going(h, tmp_path):
    """Actor handles bind to the process's current client when they arrive. A user's second
    Client to the run's scheduler (a notebook looking at it) made while the hosts start, and
    closed once they run, must not take the run's hosts with it."""
    cfg = short_config(h, "stop.max_env_steps=8000")
    run = train(cfg, out=tmp_path / "run")
    try:
        with Client(run.wait_for_cluster(), timeout="10s"):
            assert h.wait_until(lambda: run.recorder.tally.env_steps > 0 or run.done, timeout=60)
        steps_when_closed = run.recorder.tally.env_steps
        result = run.wait(timeout=60)
    finally:
        if not run.done:
            run.stop()
            run.wait(timeout=30)
    assert result is not None and result.error is None, result
    assert result.status == "max_env_steps", result
    n = h.check_run_dir(result.run_dir, cfg, mode="distributed")
    assert n["env_steps"] > steps_when_closed > 0 and n["updates"] > 0, n
    assert h.running_at_the_end(n), n["end_rates"]


def test_a_serial_run_has_no_cluster_to_wait_for(h, tmp_path):
    run = train(short_config(h, "stop.max_env_steps=2000"), out=tmp_path / "run", serial=True)
    try:
        with pytest.raises(RuntimeError, match="a serial run has no cluster to connect to"):
            run.wait_for_cluster()
    finally:
        run.stop()
        run.wait(timeout=30)


@pytest.mark.timeout(90)
def test_a_users_client_that_outlives_the_run_leaves_dasks_settings_as_they_were(h, tmp_path):
    """The run's own client is not Dask's default: a user's Client made during the run and closed
    after it would otherwise put back the setting the run's client made (scheduler
    "dask.distributed" with no client left), and every later ``compute`` in the notebook would
    fail with "no Client active". conftest's autouse check asserts the setting after the test."""
    cfg = short_config(h, "stop.max_env_steps=3000")
    with h.ending(train(cfg, out=tmp_path / "run")) as run:
        client = Client(run.wait_for_cluster(), timeout="10s")
        try:
            result = run.wait(timeout=60)
        finally:
            client.close()
    assert result is not None and result.status == "max_env_steps", result
    assert dask.config.get("scheduler", None) is None


@pytest.mark.timeout(180)
def test_a_client_failing_to_connect_while_the_hosts_start_leaves_the_run_going(h, tmp_path):
    """A notebook's Client to a wrong address is Dask's default client for as long as it tries to
    connect (``timeout``), then fails; while it tries, the run's hosts start, and their actor
    handles must still be the run's client's."""
    cfg = short_config(h, "stop.max_env_steps=3000")
    failed: list[Exception] = []
    connecting: list[bool] = []

    def on_event(text: str) -> None:  # in the run's driver thread, just before the hosts start
        if text.startswith("dashboard: "):
            threading.Thread(target=lambda: failed.append(_client_that_fails("10s")), daemon=True).start()
            # an assert here would fail the run, not the test: the test asserts what it saw
            connecting.append(h.wait_until(lambda: _default_client_status() == "connecting", timeout=60, interval=0.01))

    with h.ending(train(cfg, out=tmp_path / "run", on_event=on_event)) as run:
        result = run.wait(timeout=150)
        assert h.wait_until(lambda: failed, timeout=30), "the failing Client never gave up"
    assert connecting == [True], "the failing Client never became the default client while connecting"
    assert result is not None and result.status == "max_env_steps" and result.error is None, result and (
        result.status,
        result.error,
    )
    n = h.check_run_dir(result.run_dir, cfg, mode="distributed")
    assert n["env_steps"] >= 3000 and n["updates"] > 0, n
    assert isinstance(failed[0], OSError), failed


def _client_that_fails(timeout: str) -> Exception:
    try:
        Client("tcp://127.0.0.1:1", timeout=timeout)  # nothing listens on port 1: it retries, then fails
    except Exception as exc:  # noqa: BLE001 - what it raises is the test's finding
        return exc
    raise AssertionError("a Client to tcp://127.0.0.1:1 connected")


def _default_client_status() -> str | None:
    """The status of the client Dask gives code that has no current client of its own (a fresh
    context: what a thread outside any ``Client.as_current`` gets)."""
    try:
        return contextvars.Context().run(Client.current).status
    except ValueError:
        return None


# ------------------------------------------------------------------ serial reference
def test_a_serial_run_shorter_than_a_metrics_interval_beats_at_its_start_and_its_end(h):
    """Rates come from two beats of a host: the serial run beats as it starts, so that one
    stopped before its first interval still has them from its final beat."""
    from tianji_dask.runtime.serial import SerialRun

    run = SerialRun(short_config(h))
    beats: list = []
    steps = iter(range(20))  # 20 steps of its loop: milliseconds, within the 0.5-s interval
    run.run(beats.append, lambda: next(steps, None) is None)
    actor = [b for b in beats if b["role"] == "actor"]
    assert len(actor) == 2, beats
    assert actor[0]["counters"]["env_steps"] == 0 < actor[1]["counters"]["env_steps"]


@pytest.mark.timeout(60)
def test_serial_run_writes_the_same_files(h, tmp_path):
    cfg = short_config(h, "stop.max_env_steps=5000")
    before = children()
    result = train(cfg, out=tmp_path / "serial", serial=True).wait(timeout=45)
    assert result is not None and result.error is None, result and result.error
    assert result.status == "max_env_steps"
    n = h.check_run_dir(result.run_dir, cfg, mode="serial")
    assert n["updates"] > 0 and n["episodes"] > 0
    assert h.running_at_the_end(n), n["end_rates"]
    # the serial schedule: gradient_steps updates per train_freq env steps, no more
    a = cfg.algo
    rounds = n["env_steps"] // a.train_freq
    assert n["updates"] <= rounds * a.gradient_steps
    assert children() == before  # no Dask, no processes
    print(f"\nserial: {n}")


@pytest.mark.timeout(60)
def test_results_are_written_while_the_run_goes_on(h, tmp_path):
    """A run that dies (or whose machine is taken back) keeps what ``run.save_interval`` wrote."""
    import xarray as xr

    cfg = short_config(h, "stop.max_seconds=120", "run.save_interval=1")
    run = train(cfg, out=tmp_path / "interim", serial=True)
    metrics = run.run_dir / "metrics.nc"
    interims = []

    def interim_with_rows() -> bool:  # the first write may come before the first row
        if metrics.exists():
            interims.append(xr.load_dataset(metrics, engine="netcdf4"))
        return bool(interims) and interims[-1].sizes["time"] > 0 or run.done

    with h.ending(run):
        assert h.wait_until(interim_with_rows, timeout=60)
        assert interims and not run.done, "no interim metrics.nc with rows before the run ended"
        interim = interims[-1]
        assert (run.run_dir / "episodes.nc").exists()
        rows = interim.sizes["time"]
        assert h.wait_until(lambda: run.recorder.dataset().sizes["time"] > rows + 1, timeout=60)
        run.stop()
        result = run.wait(timeout=45)
    assert result is not None and result.error is None, result and result.error
    final = xr.load_dataset(metrics, engine="netcdf4")
    assert 0 < interim.sizes["time"] < final.sizes["time"]
    assert interim.attrs["status"] == "running" and final.attrs["status"] == result.status == "stopped"
    assert not [p for p in run.run_dir.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.timeout(60)
def test_a_failed_last_write_fails_the_run_and_the_files_say_so(h, tmp_path):
    import xarray as xr

    cfg = short_config(h, "stop.max_env_steps=1000", "stop.max_seconds=30")
    run = train(cfg, out=tmp_path / "run", serial=True)
    (run.run_dir / "episodes.nc").mkdir()  # the episodes file cannot be renamed over a directory
    result = run.wait(timeout=45)
    assert result is not None and result.status == "failed", result
    assert result.error.startswith(f"writing results to {run.run_dir} failed: IsADirectoryError"), result.error
    attrs = xr.load_dataset(run.run_dir / "metrics.nc", engine="netcdf4").attrs
    assert (attrs["status"], attrs["error"]) == ("failed", result.error.splitlines()[0])


@pytest.mark.timeout(60)
def test_a_dead_workers_cause_is_quoted():
    """Dask's nanny says why a worker process ended only at INFO, which LocalCluster hides; the
    lost-host report quotes it (a worker killed by a signal, one that exited)."""
    import signal

    from tianji_dask.runtime.cluster.worker_deaths import WORKER_DEATHS, watch_worker_deaths

    watch_worker_deaths()
    t0 = time.time()
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        pid = client.run(os.getpid)
        (pid,) = pid.values()
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while not WORKER_DEATHS.since(t0) and time.monotonic() < deadline:
            time.sleep(0.05)
    said = WORKER_DEATHS.since(t0)
    assert said == [f"Worker process {pid} was killed by signal 9"], said


# ------------------------------------------------------------------ bad input through the CLI
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "overrides, message",
    [
        (["algo.lrr=1e-3"], "unknown key 'algo.lrr'"),
        (["algo.lr"], "no '=' found"),
        (["algo.lr=-1"], "algo.lr=-1: Input should be greater than 0"),
        (["env.id=CartPol-v1"], "no such gymnasium environment; did you mean CartPole-v1"),
        (["algo.buffer_size=100000000000"], "GiB this machine has available; lower algo.buffer_size to at most"),
    ],
    ids=["unknown-key", "no-equals", "bad-value", "unknown-env", "replay-too-big"],
)
def test_cli_bad_input_exits_2_and_writes_nothing(h, tmp_path, overrides, message):
    out = tmp_path / "out"
    args = ["train", str(h.CONFIG), *(a for o in overrides for a in ("--set", o)), "--out", str(out)]
    p = h.cli_here(*args, cwd=tmp_path)  # in this process: the next test's refusal is a process's
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert message in p.stderr, p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    assert os.listdir(tmp_path) == []  # neither --out nor runs/ in the working directory


@pytest.mark.timeout(60)
def test_cli_refuses_a_non_empty_out_dir(h, tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    keep = out / "results.txt"
    keep.write_text("earlier results\n")
    stamp = keep.stat().st_mtime_ns
    p = h.cli("train", str(h.CONFIG), "--set", "stop.max_seconds=5", "--out", str(out), cwd=tmp_path)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert f"--out {out}" in p.stderr and "not an empty directory" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
    assert [q.name for q in out.iterdir()] == ["results.txt"]
    assert keep.read_text() == "earlier results\n" and keep.stat().st_mtime_ns == stamp
    assert sorted(os.listdir(tmp_path)) == ["taken"]


# ------------------------------------------------------------------ a cluster the caller owns
@pytest.fixture(scope="module")
def given_client():
    """The caller's cluster: 2 single-threaded worker processes (the lead's machine has 2 cores)."""
    with (
        forked_local_cluster(n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        yield client


@pytest.mark.timeout(90)
def test_distributed_run_with_a_given_client_leaves_it_usable_and_clean(h, tmp_path, given_client):
    client = given_client
    workers_before = sorted(scheduler_workers(client))
    pids_before = client.run(os.getpid)
    cfg = short_config(h, "stop.max_env_steps=6000")
    result = train(cfg, client, out=tmp_path / "given").wait(timeout=75)
    assert result is not None and result.error is None, result and result.error
    assert result.status == "max_env_steps"
    n = h.check_run_dir(result.run_dir, cfg, mode="distributed")
    assert h.running_at_the_end(n), n["end_rates"]

    # The driver must not close what it did not start: same client, same workers, same processes.
    assert client.status == "running"
    assert client.submit(lambda x: x + 1, 41, pure=False).result(timeout=10) == 42
    assert sorted(scheduler_workers(client)) == workers_before
    assert client.run(os.getpid) == pids_before
    # No tianji host (Dask actor, the buffers learners train from included), loop thread or open channel remains on the
    # workers, and no task or stop Event of the run on the scheduler.
    h.wait_until(lambda: clean(client), timeout=3, interval=0.2)
    left = client.run(tianji_leftovers)
    on_scheduler = client.run_on_scheduler(scheduler_leftovers)
    for worker, what in left.items():
        assert what["actors"] == 0, (worker, what)
        assert what["threads"] == [], (worker, what)
    assert on_scheduler["tasks"] == [], on_scheduler
    print(f"\ngiven client: {n}; scheduler: {on_scheduler}")
    # The actors' parameter inboxes and the run's stop Event must go too (the inboxes stayed
    # open, each holding the last parameters, until ActorHost closed them on the way out).
    leaks = {
        "channels": {w: what["channels"] for w, what in left.items() if what["channels"]},
        "events": on_scheduler["events"],
    }
    assert leaks == {"channels": {}, "events": []}, leaks


@pytest.mark.timeout(90)
def test_another_classic_control_env_by_overrides_only(h, tmp_path, given_client):
    cfg = short_config(h, "env.id=Acrobot-v1", "stop.max_env_steps=6000")
    assert cfg.env.id == "Acrobot-v1"
    result = train(cfg, given_client, out=tmp_path / "acrobot").wait(timeout=75)
    assert result is not None and result.error is None, result and result.error
    assert result.status == "max_env_steps"
    n = h.check_run_dir(result.run_dir, cfg, mode="distributed")
    assert n["obs_dim"] == 6 and n["n_actions"] == 3  # Acrobot's spaces, not CartPole's
    assert h.running_at_the_end(n), n["end_rates"]
    assert n["env_steps"] > cfg.algo.learning_starts and n["updates"] > 0
    assert result.run_dir.name == "acrobot"
    print(f"\nacrobot: {n}")


# ------------------------------------------------------------------ periodic checkpoints
def checkpoints_while_running(run, stop_after: int) -> list[dict]:
    """Each distinct checkpoint.json seen in the run directory until the run ends; the run is
    told to stop once ``stop_after`` periodic ones were seen."""
    import json

    path = run.run_dir / "checkpoint" / "checkpoint.json"
    seen: list[dict] = []
    while not run.done:
        try:
            meta = json.loads(path.read_text())
        except FileNotFoundError:  # none yet, or between the two renames of a replacement
            meta = None
        if meta and (not seen or meta["wall_s"] != seen[-1]["wall_s"]):
            seen.append(meta)
            if sum(not m["final"] for m in seen) >= stop_after:
                run.stop()
        time.sleep(0.02)
    return seen


@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode", ["serial", "distributed"])
def test_checkpoints_are_written_while_the_run_goes_on(h, tmp_path, given_client, mode):
    """A run that crashes or is killed keeps a checkpoint at most ``run.checkpoint_interval``
    old; each replaces the last whole, and the one at the end says ``final``."""
    from tianji_dask.results.checkpoint import load_checkpoint

    cfg = short_config(h, "stop.max_seconds=120", "run.checkpoint_interval=1.5")
    client = given_client if mode == "distributed" else None
    run = train(cfg, client, out=tmp_path / mode, serial=(mode == "serial"))
    seen = checkpoints_while_running(run, stop_after=2)
    result = run.wait(timeout=60)
    assert result is not None and result.error is None, result and result.error

    periodic = [m for m in seen if not m["final"]]
    assert len(periodic) >= 2, seen
    for a, b in zip(periodic, periodic[1:]):
        assert b["wall_s"] > a["wall_s"] and b["updates"] >= a["updates"] and b["env_steps"] >= a["env_steps"]
    assert periodic[-1]["updates"] > 0 and periodic[-1]["env_steps"] > 0

    state, meta = load_checkpoint(result.run_dir / "checkpoint")
    assert meta["final"] is True and meta["run_name"] == run.name
    assert meta["updates"] >= periodic[-1]["updates"] and meta["wall_s"] > periodic[-1]["wall_s"]
    assert {"online", "target", "optim_state"} <= set(state)
    assert all(t.device.type == "cpu" for t in state["online"].values())
    leftovers = [p.name for p in result.run_dir.iterdir() if p.name.startswith(".checkpoint")]
    assert leftovers == []


def test_a_negative_checkpoint_interval_is_refused(h):
    from tianji_dask.config import ConfigError

    with pytest.raises(ConfigError, match="checkpoint_interval"):
        short_config(h, "run.checkpoint_interval=-1")
