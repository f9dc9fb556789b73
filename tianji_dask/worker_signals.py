"""A run's own worker processes leave SIGINT and SIGTERM to the driver.

A terminal's Ctrl-C signals the whole foreground process group, and a job scheduler's cancel or
time limit signals every process of the job. Worker processes that took those signals would die
mid-run; the driver would see lost hosts and fail the run. So the driver alone decides how a run
stops, and ends its workers itself on every exit path (Dask's nanny stops them, any survivor is
killed, and a worker whose parent process is gone exits by itself).

Used as a worker preload (``preload=["tianji_dask.worker_signals"]``): ``dask_setup`` makes the
worker ignore both signals. Until the preload has run, a worker's first seconds, a signal still
kills it: a Ctrl-C while the run's cluster starts can fail the run.
"""

from __future__ import annotations

import signal

DRIVER_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def ignore_driver_signals() -> None:
    """In a worker's main thread: ignore SIGINT and SIGTERM."""
    for sig in DRIVER_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def dask_setup(worker) -> None:  # the preload hook Dask calls in the worker's main thread
    ignore_driver_signals()
