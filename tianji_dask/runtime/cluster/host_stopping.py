"""Stopping the run's hosts: all of them as the run ends, or one group's before it is rebuilt."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tianji_dask.runtime.cluster.run_hosts import RunHosts

STOP_TIMEOUT_S = 10.0
HURRY_POLL_S = 0.2  # how soon a host stop being waited for notices the run was told to hurry
REBUILD_STOP_S = 3.0  # how long a group being rebuilt waits for each surviving host to stop


def stop_all(hosts: RunHosts) -> list[dict]:
    """Ask every host to stop and wait for each (unless hurried); their last heartbeats."""
    pending = []
    for key in sorted(hosts.handles, key=lambda k: ({"actor": 0, "learner": 1, "buffer": 2}[k[0]], k[1])):
        try:
            pending.append(hosts.handles[key].stop(STOP_TIMEOUT_S))
        except Exception as exc:  # noqa: BLE001 - a lost worker's host cannot be reached
            hosts.on_event(f"could not stop a host: {exc!r}")
    deadline = time.monotonic() + STOP_TIMEOUT_S + 2
    final = []
    for fut in pending:
        try:
            hb = _result_unless_hurried(fut, deadline, hosts.hurry)
            if hb:
                final.append({**hb, "episodes": []})  # episodes already came by heartbeat
        except Exception as exc:  # noqa: BLE001
            hosts.on_event(f"a host did not stop cleanly: {exc!r}")
    return final


def stop_group(hosts: RunHosts, group: int) -> list[dict]:
    """First half of rebuilding a group: stop its surviving hosts and release them all, each
    one incarnation further. Returns the stopped hosts' last heartbeats (their episodes already
    came)."""
    keys = hosts.group_keys(group)
    pending = []
    for key in keys:
        with contextlib.suppress(Exception):  # a lost worker's host cannot be reached
            pending.append(hosts.handles[key].stop(REBUILD_STOP_S))
    final = []
    for fut in pending:
        try:
            hb = fut.result(timeout=REBUILD_STOP_S + 2)
            if hb:
                final.append({**hb, "episodes": []})
        except Exception:  # noqa: BLE001 - gone with its worker, or stuck on it
            pass
    for key in keys:
        hosts.release(key)
        hosts.incarnations[key] += 1
    return final


def _result_unless_hurried(fut, deadline: float, hurry: threading.Event):
    """``fut.result()`` until ``deadline``; None at once when the run is told to hurry."""
    while not hurry.is_set():
        try:
            return fut.result(timeout=max(0.01, min(HURRY_POLL_S, deadline - time.monotonic())))
        except TimeoutError:
            if time.monotonic() >= deadline:
                raise
    return None
