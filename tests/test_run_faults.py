"""A fault at any moment is survived (issue 28): a worker process of the run's own LocalCluster
killed with SIGKILL as the cluster starts, while the hosts are created, during a re-creation and
during shutdown. Each moment is reached by waiting on what the run does (a process appearing, a
host's task on the scheduler, the run's own events), never by sleeping."""

from __future__ import annotations

import os
import re
import signal
import threading
import time

import psutil
import pytest
import xarray as xr
from conftest import worker_processes
from distributed import Client, Future

from tianji_dask.config import load_config
from tianji_dask.runtime.driver import train


def _workers() -> dict[int, psutil.Process]:
    """This process's Dask worker processes, alive."""
    return {p.pid: p for p in worker_processes()}


def _kill_a_new_worker(before: set[int], kills: list[str], moment: str) -> bool:
    """SIGKILL the first worker process not in ``before`` that is still there; False if none is."""
    for pid in sorted(set(_workers()) - before):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        kills.append(moment)
        return True
    return False


def _pid_of(client: Client, address: str) -> int:
    """The process id of the worker at ``address``, as the worker itself tells it."""
    return client.run(os.getpid, workers=[address])[address]


def _host_workers(client: Client, prefix: str) -> list[str]:
    """Workers holding a host whose task key starts with ``prefix``."""

    def on_scheduler(dask_scheduler, prefix=prefix):
        tasks = dask_scheduler.tasks.items()
        return [w.address for key, ts in tasks if str(key).startswith(prefix) for w in ts.who_has or ()]

    return client.run_on_scheduler(on_scheduler)


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_a_worker_killed_at_any_moment_of_the_run_is_survived(h, tmp_path):
    cfg = load_config(h.CONFIG, [*h.SHORT, "topology.actors=1", "stop.max_seconds=200", "run.snapshot_interval=0"])
    before = set(_workers())
    kills: list[str] = []
    events: list[str] = []
    watcher: list[Client] = []
    recreating = threading.Event()

    def kill(pid: int, moment: str) -> None:
        kills.append(moment)
        os.kill(pid, signal.SIGKILL)

    def on_event(text: str) -> None:  # called in the run's driver thread, in order
        events.append(text)
        if text.startswith("scheduler: ") and not watcher:
            watcher.append(Client(text.split(" ", 1)[1], timeout="20s", set_as_default=False))
        elif text.startswith("hosts placed: ") and "hosts created" not in kills:
            # the hosts are created next, where it says: the actor's worker dies first
            (actor_worker,) = re.findall(r"actor 0 on (\S+?)(?:;|$)", text)
            kill(_pid_of(watcher[0], actor_worker), "hosts created")
        elif text.startswith("host lost: ") and "; re-creating on " in text and "re-creation" not in kills:
            # the lost actor's hosts are re-created next, on the worker named at the end
            kill(_pid_of(watcher[0], text.rsplit(" ", 1)[1]), "re-creation")
            recreating.set()

    run = train(cfg, out=tmp_path / "run", on_event=on_event)

    def until(predicate, timeout: float = 90, interval: float = 0.1) -> None:
        """Wait for ``predicate()`` while the run goes on."""
        ok = h.wait_until(lambda: predicate() or run.done, timeout, interval) and not run.done
        assert ok, f"killed {kills}; result {run.result}; events:\n" + "\n".join(events)

    with h.ending(run):
        # 1. as the LocalCluster starts: its first worker process, once it exists (found and
        # killed in one look: a process seen once may be gone by a second look)
        until(lambda: _kill_a_new_worker(before, kills, "cluster start"), interval=0.01)
        # 2. while the hosts are created: on_event kills the actor's worker once they are placed
        # 3. during a re-creation: once the run produces, the actor's worker; on_event kills its
        # replacement as the run re-creates the actor there
        until(lambda: run.recorder.tally.env_steps > 1000)
        kill(_pid_of(watcher[0], _host_workers(watcher[0], "ActorHost")[0]), "running")
        until(recreating.is_set)
        steps = run.recorder.tally.env_steps
        until(lambda: run.recorder.tally.env_steps > steps + 1000)
        # 4. during shutdown: the learner's worker, as the run stops
        learner = _pid_of(watcher[0], _host_workers(watcher[0], "LearnerHost")[0])
        watcher.pop().close()
        run.stop()
        kill(learner, "shutdown")
        result = run.wait(timeout=90)
    assert result is not None, "the run did not end"
    assert result.status == "stopped" and result.error is None, f"{result.status}: {result.error}\n" + "\n".join(events)
    assert kills == ["cluster start", "hosts created", "running", "re-creation", "shutdown"], kills
    said = "\n".join(events)
    assert "the run's LocalCluster did not start" in said, said
    assert "host lost while the hosts were created" in said, said
    assert "no final checkpoint: the learner's worker" in said, said
    for name in ("metrics.nc", "episodes.nc"):
        with xr.open_dataset(result.run_dir / name, engine="netcdf4") as ds:
            assert ds.attrs["status"] == "stopped" and ds.attrs["error"] == "", (name, ds.attrs["error"])
    with xr.open_dataset(result.run_dir / "metrics.nc", engine="netcdf4") as ds:
        last = ds.isel(time=-1).load()
    assert int(last.env_steps) > 2000 and int(last.updates) > 0 and int(last.actor_restarts) >= 1, last
    # every worker process of both LocalClusters, the nannies' restarts included, is gone
    assert h.wait_until(lambda: not set(_workers()) - before, timeout=10), set(_workers()) - before


def _cancel_when_queued(client: Client, prefix: str, worker: str, done: threading.Event) -> None:
    """Cancel, for every client (``force=True``, as the scheduler itself would), the first task
    whose key starts with ``prefix`` once it waits on ``worker``."""

    def queued(dask_scheduler, prefix=prefix, worker=worker):
        return [
            key
            for key, ts in dask_scheduler.tasks.items()
            if str(key).startswith(prefix) and ts.state == "processing" and ts.processing_on.address == worker
        ]

    while not done.is_set():
        keys = client.run_on_scheduler(queued)
        if keys:
            client.cancel([Future(keys[0], client)], force=True)
            done.set()
            return
        time.sleep(0.01)


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_a_recreation_that_fails_on_a_live_worker_is_tried_again(h, tmp_path):
    """The scheduler cancels the re-created actor's task on its new worker, which stays: the
    run tries the re-creation again (without the retry, the actor was expected there for
    ``tianji.timeouts.host-startup`` and the run failed)."""
    cfg = load_config(h.CONFIG, [*h.SHORT, "topology.actors=1", "stop.max_seconds=150", "run.snapshot_interval=0"])
    events: list[str] = []
    watcher: list[Client] = []
    cancelled = threading.Event()

    def on_event(text: str) -> None:  # called in the run's driver thread, before it acts on it
        events.append(text)
        if text.startswith("scheduler: ") and not watcher:
            watcher.append(Client(text.split(" ", 1)[1], timeout="20s", set_as_default=False))
        elif text.startswith("host lost: ") and "; re-creating on " in text and not cancelled.is_set():
            new = text.rsplit(" ", 1)[1]
            # the new worker's one thread is busy when the actor's task comes: it waits there,
            # queued, for the canceller
            busy = watcher[0].submit(time.sleep, 3, workers=[new], pure=False)
            assert h.wait_until(lambda: busy.status == "pending" and _processing(watcher[0], busy.key), 20)
            threading.Thread(
                target=_cancel_when_queued, args=(watcher[0], "ActorHost", new, cancelled), daemon=True
            ).start()

    run = train(cfg, out=tmp_path / "run", on_event=on_event)

    def until(predicate, timeout: float = 90) -> None:
        ok = h.wait_until(lambda: predicate() or run.done, timeout) and not run.done
        assert ok, f"result {run.result}; events:\n" + "\n".join(events)

    with h.ending(run):
        until(lambda: watcher and run.recorder.tally.env_steps > 1000)
        os.kill(_pid_of(watcher[0], _host_workers(watcher[0], "ActorHost")[0]), signal.SIGKILL)
        until(lambda: any("trying again" in e for e in events))
        steps = run.recorder.tally.env_steps
        until(lambda: run.recorder.tally.env_steps > steps + 1000)
        watcher.pop().close()
        run.stop()
        result = run.wait(timeout=60)
    said = "\n".join(events)
    assert result is not None and result.status == "stopped" and result.error is None, f"{result}\n{said}"
    assert cancelled.is_set()
    assert "re-creating actor 0 did not finish (the scheduler cancelled a host's task" in said, said
    assert "trying again (2 of 3)" in said, said


def _processing(client: Client, key: str) -> bool:
    """Whether the scheduler has given task ``key`` to a worker (a just-submitted key may not be there yet)."""

    def state(dask_scheduler, key=key):
        ts = dask_scheduler.tasks.get(key)
        return ts.state if ts is not None else None

    return client.run_on_scheduler(state) == "processing"
