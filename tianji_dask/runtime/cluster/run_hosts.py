"""The hosts of one run on its cluster, by key: where the placement puts them, their handles,
and the waits on them.

Every host is known by its key (role, global id) and its *incarnation*: 0 for the host the
run started with, k for its k-th re-creation (:mod:`~tianji_dask.runtime.cluster.recovery`). Building
them is :class:`~tianji_dask.runtime.cluster.host_builder.HostBuilder`'s job, stopping them
:mod:`~tianji_dask.runtime.cluster.host_stopping`'s.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tianji_dask.config.deployment import deployment_settings
from tianji_dask.errors import HostLost
from tianji_dask.runtime.cluster.placement import Placement, moved, place
from tianji_dask.runtime.cluster.restarts import Key
from tianji_dask.runtime.cluster.worker_replacement import WorkerReplacement
from tianji_dask.runtime.cluster.workers import scheduler_workers
from tianji_dask.runtime.processes.client_context import current_client

if TYPE_CHECKING:
    from tianji_dask.config.schema import ExperimentConfig

WAIT_POLL_S = 0.5  # how often a wait for a host asks whether its worker is still there
DONE_POLL_S = 0.005  # how often it looks whether the host answered


class StartAbandoned(BaseException):
    """The run was asked to stop while its cluster or hosts were starting: the start is given up.
    Not an ``Exception``: no handler of a failed host creation (which waits to see whether a
    worker was lost) may take it for one."""


class RunHosts:
    """Handles of the run's hosts by key, their incarnations, and the placement they follow."""

    def __init__(
        self,
        client,
        cfg: ExperimentConfig,
        run_id: str,
        on_event: Callable[[str], None],
        hurry: threading.Event,
    ):
        self.client = client
        self.cfg = cfg
        self.run_id = run_id
        self.on_event = on_event
        self.hurry = hurry  # set: stop without waiting for the hosts
        self.handles: dict[Key, Any] = {}
        self._futures: dict[Key, Any] = {}
        self.incarnations: dict[Key, int] = defaultdict(int)
        self.plan: Placement | None = None
        self.replacement = WorkerReplacement(client, on_event, hurry)
        # set while the hosts are first created: the run was asked to stop, give the start up
        self.abandon: threading.Event | None = None
        self._startup_s = deployment_settings().timeouts.host_startup

    # --- views ------------------------------------------------------------------------
    def current_plan(self) -> Placement:
        if self.plan is None:
            raise RuntimeError("the run's hosts were used before they were placed")
        return self.plan

    def group_of(self, key: Key) -> int:
        t = self.cfg.topology
        return key[1] // (t.actors if key[0] == "actor" else t.learners)

    def group_keys(self, group: int) -> list[Key]:
        t = self.cfg.topology
        learners = range(group * t.learners, (group + 1) * t.learners)
        actors = range(group * t.actors, (group + 1) * t.actors)
        return [
            *(("buffer", i) for i in learners),
            *(("learner", i) for i in learners),
            *(("actor", i) for i in actors),
        ]

    def lead(self, group: int):
        """The handle of the group's rank-0 learner (it publishes the parameters)."""
        return self.handles[("learner", group * self.cfg.topology.learners)]

    def worker_of(self, key: Key) -> str:
        return self.current_plan().host_workers()[key]

    def futures(self) -> list:
        return list(self._futures.values())

    # --- placement ----------------------------------------------------------------------
    def place_all(self) -> Placement:
        workers = scheduler_workers(self.client)
        self.replacement.know(workers)
        self.plan = place(workers, self.cfg.topology, self.run_id, self.cfg.seed)
        return self.plan

    def move_to_replacement(self, lost: str, timeout: float) -> str:
        """Move the hosts and addresses of the lost worker ``lost`` in the plan to the worker
        that takes its place (:meth:`WorkerReplacement.find`); returns that worker."""
        new = self.replacement.find(lost, timeout, self.current_plan())
        self.plan = moved(self.current_plan(), lost, new)
        return new

    # --- tasks --------------------------------------------------------------------------
    def submit(self, key: Key, cls, *args, worker: str, **kwargs):
        """Create the host ``key`` of class ``cls`` on ``worker`` (a Dask actor); its future."""
        fut = self.client.submit(
            cls, *args, **kwargs, actor=True, workers=[worker], allow_other_workers=False, pure=False
        )
        self._futures[key] = fut
        return fut

    def wait(self, fut, worker: str):
        """``fut.result()`` of a host's creation or of a call to it on ``worker``; raises
        :class:`HostLost` at once if that worker leaves meanwhile (a task pinned to a worker that
        is gone would wait forever), and after ``tianji.timeouts.host-startup``.

        It polls ``fut.done()`` and reads the result once it is done. A task the scheduler
        cancelled raises :class:`HostLost` here: read through Dask's ``sync``, its
        ``CancelledError`` (not an ``Exception``) would surface as an ``UnboundLocalError``."""
        deadline = time.monotonic() + self._startup_s
        next_check = time.monotonic() + WAIT_POLL_S
        while not fut.done():
            time.sleep(DONE_POLL_S)
            if self.abandon is not None and self.abandon.is_set():
                raise StartAbandoned("the run was asked to stop while its hosts were created")
            if time.monotonic() < next_check:
                continue
            next_check = time.monotonic() + WAIT_POLL_S
            if worker not in scheduler_workers(self.client):
                raise HostLost(f"worker {worker} left the cluster while the run's hosts were created on it")
            if time.monotonic() > deadline:
                raise HostLost(
                    f"a host on {worker} was not created within {self._startup_s:g} s (tianji.timeouts.host-startup)"
                )
        if getattr(fut, "cancelled", lambda: False)():
            raise HostLost(f"the scheduler cancelled a host's task on {worker}")
        # A host's actor handle binds, as it arrives, to the current client (Dask's Actor asks
        # get_client()): outside this block, in whatever thread waits here, that is the newest
        # Client of the process, which may be another the user made (tianji_dask.runtime.processes.client_context).
        with current_client(self.client):
            return fut.result()

    def release(self, key: Key) -> None:
        """Forget the host ``key`` and cancel its task."""
        fut = self._futures.pop(key, None)
        self.handles.pop(key, None)
        if fut is not None:
            with contextlib.suppress(Exception):  # the scheduler may have forgotten it with its worker
                self.client.cancel([fut])
