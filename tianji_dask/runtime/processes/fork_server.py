"""The fork server a run's LocalCluster forks its worker processes from: multiprocessing's
``forkserver``, one per driver process, with everything a worker of a run imports imported once
(:data:`PRELOAD`), so that a worker's start takes a fraction of a second instead of the seconds
of those imports. It ends with the process that started it.

:func:`start_fork_server` starts it inside
:func:`~tianji_dask.runtime.processes.worker_signals.spawned_ignoring_driver_signals`, so the server
and every worker forked from it ignore SIGINT and SIGTERM from their first instruction (an ignored
signal stays ignored across ``fork``), with Dask's pre-spawn environment (``MALLOC_TRIM_THRESHOLD_``,
``OMP_NUM_THREADS``: read when a process starts, and a fork inherits the server's). This module
imports only what starting it needs (not Dask's distributed), so that the CLI can start it at
its first line, its imports overlapping the driver's own.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import multiprocessing
import multiprocessing.forkserver
import os
import shutil
import signal
import tempfile
import threading
import time

import dask.config
import psutil

from tianji_dask.runtime.processes.worker_signals import spawned_ignoring_driver_signals

# imported once in the fork server: everything a worker of a run imports
PRELOAD = [
    "distributed",
    "gymnasium",
    "tianji_dask.runtime.hosts.hosts",
    "tianji_dask.runtime.hosts.dataparallel",  # imports torch, which the hosts module leaves to its learners
    "tianji_dask.runtime.processes.fork_server_frozen",  # last: gc.freeze() after the imports
]


#: the variable naming the file the fork server creates once its imports are done
READY_VARIABLE = "TIANJI_FORK_SERVER_READY"
_ready_file: str | None = None  # that of the server this process started last


def start_fork_server() -> bool:
    """Start the fork server with :data:`PRELOAD` imported, if it is not running; whether it
    started one. It returns at once: the server imports while the caller goes on, and the first
    fork waits for it, so a driver that starts it early has its seconds of imports overlap its own."""
    global _ready_file
    started = not fork_server_running()
    with spawned_ignoring_driver_signals():
        os.environ.update(pre_spawn_environ())
        if started:
            _ready_file = os.path.join(_ready_directory(), f"ready-{time.monotonic_ns()}")
            os.environ[READY_VARIABLE] = _ready_file
        multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
        multiprocessing.forkserver.ensure_running()
    return started


@functools.cache
def _ready_directory() -> str:
    directory = tempfile.mkdtemp(prefix="tianji-dask-fork-server-")
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    return directory


def _server_pid() -> int | None:
    """The pid of this process's fork server, once one was started (multiprocessing's own record)."""
    return getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)


def fork_server_running() -> bool:
    """Whether this process's fork server runs (started, and neither ended nor a zombie)."""
    pid = _server_pid()
    if not pid:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_for_fork_server(give_up: threading.Event, poll_s: float = 0.02) -> bool:
    """Wait until the fork server has made its imports (its ready file exists, or it ended: the
    LocalCluster's start then says why); False as soon as ``give_up`` is set, leaving it to
    import on. A run's LocalCluster starts once this returns True: its start then takes a
    fraction of a second, where the imports take seconds that a stop would otherwise have to
    wait out. A server this process did not start (no ready file of ours) is waited for with a
    process forked from it, which exits at once."""
    if _ready_file is None or not fork_server_running():
        return _wait_for_a_fork(give_up, poll_s)
    while not os.path.exists(_ready_file):
        if give_up.is_set():
            return False
        if not fork_server_running():
            return True
        time.sleep(poll_s)
    return True


def _wait_for_a_fork(give_up: threading.Event, poll_s: float) -> bool:
    ready = threading.Event()

    def probe() -> None:
        with contextlib.suppress(Exception):  # a server that failed: the LocalCluster's start says why
            process = multiprocessing.get_context("forkserver").Process(target=int, name="tianji-fork-probe")
            process.start()
            process.join()
        ready.set()

    threading.Thread(target=probe, name="tianji-fork-server-probe", daemon=True).start()
    while not ready.wait(poll_s):
        if give_up.is_set():
            return False
    return True


def end_fork_server() -> None:
    """End this process's fork server, if one runs: one still importing takes the CPU a stopping
    run writes its results with, and would end by itself only once its imports are done. Not
    reaped: the next run's ``ensure_running`` reaps it and starts another (the pid of an unreaped
    child is no other process's)."""
    pid = _server_pid()
    if pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def pre_spawn_environ() -> dict[str, str]:
    """What Dask's nanny puts in the parent's environment before it starts a worker process:
    ``distributed.nanny.pre-spawn-environ`` (a variable already set wins), and a fixed
    ``PYTHONHASHSEED`` for hashing that is the same in every worker."""
    config = dask.config.get("distributed.nanny.pre-spawn-environ", default=None) or {}
    env = {k: os.environ.get(k, str(v)) for k, v in config.items() if v is not None}
    if env.get("PYTHONHASHSEED") in (None, "0"):
        env["PYTHONHASHSEED"] = "6640"  # Dask's number
    return env
