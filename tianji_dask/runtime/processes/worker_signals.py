"""A run's own worker processes leave SIGINT and SIGTERM to the driver.

A terminal's Ctrl-C signals the whole foreground process group, and a job scheduler's cancel or
time limit signals every process of the job. Worker processes that took those signals would die
mid-run; the driver would see lost hosts and fail the run. So the driver alone decides how a run
stops, and ends its workers itself on every exit path (Dask's nanny stops them, any survivor is
killed, and a worker whose parent process is gone exits by itself).

Two pieces, for the two ways a worker comes to life:

- :func:`spawned_ignoring_driver_signals`: while a LocalCluster starts, the thread that starts it
  blocks both signals, so Dask's IO-loop thread and the threads that fork the workers inherit the
  block, and each worker is forked with them blocked. The workers are spawned through a two-line
  shell script that ignores both signals and then execs Python: an ignored signal stays ignored
  across ``exec`` (and Python leaves an ignored SIGINT alone). So a signal can reach no worker
  from its fork on, through the seconds of importing Dask.
  The run's fork server (:mod:`tianji_dask.runtime.processes.fork_server`) is started the same way; the
  workers forked from it inherit its ignored signals.
- The worker preload (``preload=["tianji_dask.runtime.processes.worker_signals"]``): ``dask_setup`` makes the worker
  ignore both signals once it runs, whoever started the process (a nanny restart, a batch job).
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import multiprocessing.spawn
import os
import shlex
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from multiprocessing import resource_tracker

DRIVER_SIGNALS = (signal.SIGINT, signal.SIGTERM)

_spawn_lock = threading.Lock()


def ignore_driver_signals() -> None:
    """In a worker's main thread: ignore SIGINT and SIGTERM."""
    for sig in DRIVER_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def dask_setup(worker) -> None:  # the preload hook Dask calls in the worker's main thread
    ignore_driver_signals()
    # forked with them blocked (spawned_ignoring_driver_signals): ignored now, so unblocking
    # discards any that arrived, and what the worker starts later inherits a normal mask
    signal.pthread_sigmask(signal.SIG_UNBLOCK, DRIVER_SIGNALS)


def _launcher_text(python: str) -> str:
    names = " ".join(signal.Signals(s).name.removeprefix("SIG") for s in DRIVER_SIGNALS)
    return f"#!/bin/sh\ntrap '' {names}\nexec {shlex.quote(python)} \"$@\"\n"


_launchers: dict[str, str] = {}  # python -> its launcher, made once per process


def _launcher(python: str) -> str | None:
    """The launcher of ``python``: made once and kept until this process exits, because a
    process spawned through it reads the script after its spawner has gone on (the fork server,
    started as its block ends). None where it cannot run (no ``/bin/sh``, or a temporary
    directory mounted ``noexec``)."""
    if python not in _launchers:
        directory = tempfile.mkdtemp(prefix="tianji-dask-spawn-")
        atexit.register(_remove_launchers, directory, os.getpid())
        launcher = os.path.join(directory, "python")
        with open(launcher, "w") as f:
            f.write(_launcher_text(python))
        os.chmod(launcher, 0o700)
        _launchers[python] = launcher
    launcher = _launchers[python]
    return launcher if os.path.exists("/bin/sh") and os.access(launcher, os.X_OK) else None


def _remove_launchers(directory: str, maker: int) -> None:
    if os.getpid() == maker:  # not in a forked child that exits normally
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def spawned_ignoring_driver_signals() -> Iterator[None]:
    """Processes that ``multiprocessing``'s spawn method starts inside this block, and threads
    started in it, have SIGINT and SIGTERM blocked from their start; spawned processes also ignore
    both (the launcher). Outside it, spawning is as it was and the calling thread's mask is back.

    The launcher is left out where it cannot run (no ``/bin/sh``, or a temporary directory
    mounted ``noexec``): the block, and then the preload, still cover the worker."""
    # multiprocessing's resource tracker, when it starts, unblocks both signals in the thread
    # that starts it (Dask's IO loop, at the first worker): start it now, before the block
    resource_tracker.ensure_running()
    with _spawn_lock:  # one block at a time: each sees the executable the last one put back
        previous = multiprocessing.spawn.get_executable()
        launcher = _launcher(os.fsdecode(previous) if previous is not None else sys.executable)
        if launcher is not None:
            multiprocessing.spawn.set_executable(launcher)
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, DRIVER_SIGNALS)
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            if launcher is not None:
                multiprocessing.spawn.set_executable(previous)
