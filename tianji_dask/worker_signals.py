"""A run's own worker processes leave SIGINT and SIGTERM to the driver.

A terminal's Ctrl-C signals the whole foreground process group, and a job scheduler's cancel or
time limit signals every process of the job. Worker processes that took those signals would die
mid-run; the driver would see lost hosts and fail the run. So the driver alone decides how a run
stops, and ends its workers itself on every exit path (Dask's nanny stops them, and a worker whose
parent process is gone exits by itself).

Two halves, because a signal may come at any moment of a worker's start-up:

- :func:`blocked_for_children`, in the driver: while it is active, SIGINT and SIGTERM are blocked
  in the calling thread, so the threads it starts (the LocalCluster's event loop, which spawns
  every worker process, restarts included) and the processes they spawn inherit them blocked.
- ``dask_setup``, this module as a worker preload (``preload=["tianji_dask.worker_signals"]``): the
  worker ignores both signals, then unblocks them; any that came during start-up are dropped.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

DRIVER_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})


@contextlib.contextmanager
def blocked_for_children() -> Iterator[None]:
    """Block the driver's signals in this thread for the duration (threads and processes started
    meanwhile inherit the mask); the thread's previous mask is restored afterwards."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, DRIVER_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def ignore_driver_signals() -> None:
    """In a worker's main thread: ignore SIGINT and SIGTERM, then unblock them."""
    for sig in DRIVER_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, DRIVER_SIGNALS)


def dask_setup(worker) -> None:  # the preload hook Dask calls in the worker's main thread
    ignore_driver_signals()
