"""Why a worker left the cluster, in the words of those who saw it: the nannies of this process
(their log) and the scheduler (its events)."""

from __future__ import annotations

import collections
import logging
import time

NANNY_POLL_S = 0.05  # how often death_reasons looks for what the nannies logged


class WorkerDeathLog(logging.Handler):
    """Dask's nannies log why a worker process ended ("killed by signal 9", "exited with status
    1") at INFO, which LocalCluster's log silencing hides; a lost-host report quotes them."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: collections.deque[tuple[float, str]] = collections.deque(maxlen=32)

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if msg.startswith("Worker process"):
            self.messages.append((record.created, msg))

    def since(self, t: float) -> list[str]:
        return [m for created, m in list(self.messages) if created >= t]


WORKER_DEATHS = WorkerDeathLog()


def watch_worker_deaths() -> None:
    nanny_log = logging.getLogger("distributed.nanny")
    if WORKER_DEATHS not in nanny_log.handlers:
        nanny_log.addHandler(WORKER_DEATHS)


def death_reasons(since: float, wait_s: float = 1.0) -> str:
    """What the nannies in this process said about workers that ended since ``since``
    (LocalClusters only: a remote nanny logs on its own host). The nanny may notice a
    moment after the scheduler does."""
    deadline = time.time() + wait_s
    while not (said := WORKER_DEATHS.since(since)) and time.time() < deadline:
        time.sleep(NANNY_POLL_S)
    return f"; Dask's nanny: {'; '.join(said)}" if said else ""


def removal_reason(client, where: str) -> str:
    """The scheduler's own record of why it removed the worker ``where`` (its stimulus id names
    the cause: a closed connection, a missed heartbeat TTL, a retirement...)."""
    try:
        events = client.get_events(where)
    except Exception:  # noqa: BLE001 - the report must not fail for want of detail
        return ""
    why = [
        msg.get("stimulus_id", "?")
        for _, msg in events
        if isinstance(msg, dict) and msg.get("action") == "remove-worker"
    ]
    return f"; the scheduler removed it ({why[-1]})" if why else ""
