"""A run's worker processes ignore SIGINT and SIGTERM from their first instruction on, so a
Ctrl-C or a group SIGTERM while the run's cluster starts cannot kill one (the driver alone
decides how a run stops). The signals are sent for real, to real spawned processes."""

from __future__ import annotations

import multiprocessing
import multiprocessing.spawn
import os
import signal
import threading
import time

import psutil
import pytest
from conftest import FORK_SERVER, worker_processes

from tianji_dask.runtime.processes.worker_signals import DRIVER_SIGNALS, spawned_ignoring_driver_signals


def _report_dispositions(queue) -> None:
    queue.put({int(s): signal.getsignal(s) == signal.SIG_IGN for s in DRIVER_SIGNALS})


def _dispositions_of_a_spawned_child() -> dict[int, bool]:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_report_dispositions, args=(queue,))
    proc.start()
    try:
        return queue.get(timeout=60)
    finally:
        proc.join(30)


@pytest.mark.slow  # spawns two Python processes
@pytest.mark.timeout(120)
def test_processes_spawned_inside_the_block_ignore_the_driver_signals_and_others_do_not():
    before = multiprocessing.spawn.get_executable()
    with spawned_ignoring_driver_signals():
        inside = _dispositions_of_a_spawned_child()
    assert multiprocessing.spawn.get_executable() == before  # spawning is as it was
    outside = _dispositions_of_a_spawned_child()
    assert inside == {int(s): True for s in DRIVER_SIGNALS}
    assert outside == {int(s): False for s in DRIVER_SIGNALS}


def _exit_zero() -> None:
    pass


@pytest.mark.slow  # spawns Python processes
@pytest.mark.timeout(120)
def test_a_process_spawned_as_the_block_ends_still_starts_through_the_launcher():
    """A spawned process reads the launcher script after its spawner went on: as a fork server
    started just before its block ends does. The launcher outlives the block."""
    ctx = multiprocessing.get_context("spawn")
    procs = []
    for _ in range(5):
        with spawned_ignoring_driver_signals():
            proc = ctx.Process(target=_exit_zero)
            proc.start()
        procs.append(proc)
    for proc in procs:
        proc.join(60)
    assert [p.exitcode for p in procs] == [0] * 5


def _cluster_processes() -> list[psutil.Process]:
    """This process's worker processes and fork server (``tianji_dask.runtime.processes.fork_server``), from the
    moment they exist (a spawned one from its exec, before which it is a fork of this process
    with the signals already blocked)."""
    out = worker_processes()
    for p in psutil.Process().children():
        try:
            if FORK_SERVER in " ".join(p.cmdline()):
                out.append(p)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            pass
    return out


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_signals_while_a_runs_cluster_starts_kill_no_worker():
    from distributed import Client

    from tianji_dask.runtime.cluster.cluster import local_cluster

    made: dict = {}

    def start() -> None:
        try:
            made["cluster"] = local_cluster(2)
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            made["error"] = exc

    starter = threading.Thread(target=start)
    starter.start()
    hit: dict[int, int] = {}
    while starter.is_alive():  # signal every process as soon as it exists, until the cluster is up
        for p in _cluster_processes():
            for sig in DRIVER_SIGNALS:
                try:
                    p.send_signal(sig)
                    hit[p.pid] = hit.get(p.pid, 0) + 1
                except psutil.NoSuchProcess:
                    pass
        time.sleep(0.02)
    starter.join()
    assert "error" not in made, repr(made.get("error"))
    cluster = made["cluster"]
    try:
        pids = {n.pid for n in cluster.workers.values()}
        assert pids <= set(hit) and min(hit[pid] for pid in pids) >= 1, (hit, pids)  # each signalled as it started
        with Client(cluster) as client:
            assert sorted(client.run(os.getpid).values()) == sorted(pids)  # the same processes, alive
        # the fork server (this process's, which earlier tests' clusters may have used too) was
        # signalled and lives on; a worker of an earlier test on its way out may have ended meanwhile
        servers = [p.pid for p in psutil.Process().children() if FORK_SERVER in " ".join(p.cmdline())]
        assert servers and set(servers) <= set(hit), (servers, hit)
    finally:
        cluster.close()  # ends the workers, which ignore SIGTERM
    assert not worker_processes()
