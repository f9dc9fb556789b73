"""Dask's own log output (``distributed.scheduler - INFO - ...``) kept quiet while any of this
process's LocalClusters is open, however many are open at once and in whatever order they close.

Dask silences its stream handlers per cluster (and per nanny) with a context manager that puts
back the level it found when the cluster closes. With two clusters in one process (a sweep's
runs) the first to close puts INFO back while the other still runs, and that one's shutdown
prints some thirty INFO lines. :func:`acquire` and :func:`release` count the open clusters
instead: the first silences the handlers before Dask looks at them (so Dask finds nothing to
put back), and the last puts back what the first found.
"""

from __future__ import annotations

import logging
import threading

QUIET_LEVEL = logging.WARNING  # LocalCluster's own silence_logs default
LOGGERS = ("distributed", "bokeh")  # those whose stream handlers Dask silences

_lock = threading.Lock()
_holders = 0
_saved: list[tuple[logging.Handler, int]] = []


def _stream_handlers() -> list[logging.Handler]:
    return [h for name in LOGGERS for h in logging.getLogger(name).handlers if isinstance(h, logging.StreamHandler)]


def acquire() -> None:
    """One more open cluster: Dask's stream handlers print warnings and errors only."""
    global _holders
    with _lock:
        _holders += 1
        if _holders > 1:
            return
        for handler in _stream_handlers():
            if handler.level != QUIET_LEVEL:  # as Dask's silencing: it then finds nothing to change
                _saved.append((handler, handler.level))
                handler.setLevel(QUIET_LEVEL)


def release() -> None:
    """One open cluster fewer; the last puts back the levels the first found."""
    global _holders
    with _lock:
        _holders = max(0, _holders - 1)
        if _holders:
            return
        for handler, level in _saved:
            handler.setLevel(level)
        _saved.clear()
