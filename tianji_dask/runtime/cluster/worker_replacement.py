"""The worker that takes over a lost worker's hosts."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

from tianji_dask.errors import HostLost
from tianji_dask.runtime.cluster.placement import Placement
from tianji_dask.runtime.cluster.workers import scheduler_workers

TAKEOVER_WAIT_S = 15.0  # how long a lost worker's hosts wait for its replacement before sharing another
TAKEOVER_POLL_S = 0.1  # how often that wait asks the scheduler for the replacement


class WorkerReplacement:
    """Knows each worker the run placed hosts on by name and planner tags, and finds the one
    that takes a lost worker's place (:meth:`find`)."""

    def __init__(self, client, on_event: Callable[[str], None], hurry: threading.Event):
        self.client = client
        self._on_event = on_event
        self._hurry = hurry
        self.worker_names: dict[str, str] = {}
        self.worker_resources: dict[str, dict] = {}
        # a cluster that submits its ended batch jobs again (slurm_cluster.PlannedSLURMCluster)
        self._replace_jobs = getattr(getattr(client, "cluster", None), "replace_ended_jobs", None)

    def know(self, workers: dict[str, dict]) -> None:
        """The scheduler's workers (address -> info) as the hosts are placed on them."""
        self.worker_names = {a: str(info.get("name", a)) for a, info in workers.items()}
        self.worker_resources = {a: dict(info.get("resources") or {}) for a, info in workers.items()}

    def find(self, lost: str, timeout: float, plan: Placement) -> str:
        """The worker that takes over ``lost``'s hosts: the one of the same name (a
        LocalCluster's nanny restarts a killed process under its name, with a new address), or
        one with the same planner tags (a replacement batch job). If none comes within
        ``TAKEOVER_WAIT_S`` (a nanny does not restart a process killed while it starts, a
        cancelled job may not be replaced), the live worker holding the fewest of ``plan``'s
        hosts shares its process with them. On a cluster that submits its ended batch jobs
        again, it asks for that every second and waits for the replacement job's worker for up
        to ``timeout``."""
        name, tags = self.worker_names.get(lost, lost), self.worker_resources.get(lost, {})
        t0 = time.monotonic()
        takeover_wait = min(TAKEOVER_WAIT_S if self._replace_jobs is None else timeout, timeout)
        next_replace = t0
        while True:
            if self._replace_jobs is not None and time.monotonic() >= next_replace:
                next_replace = time.monotonic() + 1.0
                try:
                    for job in self._replace_jobs():
                        self._on_event(f"batch job {job} ended: submitted it again")
                except Exception as exc:  # noqa: BLE001 - Slurm's tools failing must not end the wait
                    self._on_event(f"could not submit ended batch jobs again: {exc}")
            workers = scheduler_workers(self.client)
            if lost in workers:  # the host failed, its worker did not
                return lost
            same_name = sorted(a for a, info in workers.items() if str(info.get("name", a)) == name)
            same_tags = sorted(a for a, info in workers.items() if tags and dict(info.get("resources") or {}) == tags)
            candidates = same_name or same_tags
            waited = time.monotonic() - t0
            if not candidates and waited > takeover_wait and workers:
                load = collections.Counter(plan.host_workers().values())
                candidates = sorted(workers, key=lambda a: (load[a], a))[:1]
                self._on_event(f"no worker took {lost}'s place within {waited:.0f} s: its hosts share {candidates[0]}")
            for address in candidates:
                self.worker_names[address] = str(workers[address].get("name", address))
                self.worker_resources[address] = dict(workers[address].get("resources") or {})
                return address
            if waited > timeout:
                raise HostLost(
                    f"no worker took over from {lost} (name {name!r}) within {timeout:g} s "
                    "(tianji.timeouts.host-startup): its hosts cannot be re-created"
                )
            if self._hurry.is_set():
                raise HostLost(f"the run was stopped while waiting for a worker to take over from {lost}")
            time.sleep(TAKEOVER_POLL_S)
