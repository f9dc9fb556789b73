"""The supervision of a run's hosts: their heartbeats, and whether each host and its worker are
still there."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from tianji_dask.config.deployment import deployment_settings
from tianji_dask.errors import HostLost
from tianji_dask.runtime.cluster.restarts import Key, LostWorker
from tianji_dask.runtime.cluster.worker_deaths import death_reasons, removal_reason
from tianji_dask.runtime.cluster.workers import scheduler_workers
from tianji_dask.runtime.hosts.host_loop import metrics_topic

if TYPE_CHECKING:
    from tianji_dask.config.schema import ExperimentConfig
    from tianji_dask.runtime.cluster.run_hosts import RunHosts

WORKER_CHECK_S = 1.0  # how often the run asks the scheduler whether its hosts' workers are still there
ERROR_GRACE_S = 3.0  # how long a host's error waits for a lost worker that explains it
ERROR_GRACE_POLL_S = 0.1  # how often that wait asks the scheduler


class Supervisor:
    """Receives the hosts' heartbeats (:meth:`subscribe`); :meth:`check_health` names the
    workers lost since it last looked and fails the run for a host that reported an error or
    went silent. ``since``: when the run began, the earliest nanny message a loss quotes."""

    def __init__(self, client, cfg: ExperimentConfig, run_id: str, on_event: Callable[[str], None], *, since: float):
        self.client = client
        self.cfg = cfg
        self.run_id = run_id
        self._on_event = on_event
        self.hosts: RunHosts | None = None  # set as they are placed: heartbeats of replaced hosts are dropped
        self._expected: dict[Key, str] = {}  # host -> its worker, once started
        self._last_rx: dict[Key, float] = {}
        self._last_hb: dict[Key, dict] = {}
        self._errors: list[tuple[float, Key, str]] = []
        self._subscribed = False
        self._started_at = since
        self._host_started: dict[Key, float] = {}
        self._startup_grace_s = deployment_settings().timeouts.host_startup
        self._next_worker_check = 0.0
        self._deaths_since = since
        self._said_ready = False  # the hosts' start-up times, said once

    # --- heartbeats -----------------------------------------------------------------------
    def subscribe(self, on_heartbeat: Callable[[dict], None]) -> None:
        def handler(event):
            _, hb = event
            key = (hb.get("role"), hb.get("id"))
            current = self.hosts is None or hb.get("incarnation", 0) >= self.hosts.incarnations[key]
            if current:  # a late heartbeat of a host already replaced is history
                self._last_rx[key] = time.time()
                self._last_hb[key] = hb
                if hb.get("error"):
                    self._errors.append((time.time(), key, hb["error"]))
            on_heartbeat(hb)

        self.client.subscribe_topic(metrics_topic(self.run_id), handler)
        self._subscribed = True

    def unsubscribe(self) -> None:
        if self._subscribed:
            self.client.unsubscribe_topic(metrics_topic(self.run_id))
            self._subscribed = False

    def last_heartbeat(self, key: Key) -> dict:
        """The newest heartbeat of the host's current incarnation ({} before its first)."""
        return self._last_hb.get(key) or {}

    # --- the hosts it expects -------------------------------------------------------------
    def hosts_started(self, expected: dict[Key, str]) -> None:
        """Every host (host -> its worker) was created and started: from now on each must send
        heartbeats and keep its worker."""
        self._expected = dict(expected)
        self._started_at = self._deaths_since = time.time()

    def hosts_recreated(self, recreated: set[Key], expected: dict[Key, str]) -> None:
        """The hosts ``recreated`` begin again: their start-up grace, no heartbeat nor error of
        their predecessors; ``expected`` is where every host is now."""
        now = time.time()
        for key in recreated:
            self._last_rx.pop(key, None)
            self._host_started[key] = now
        self._errors = [e for e in self._errors if e[1] not in recreated]
        self._expected = dict(expected)

    # --- health ---------------------------------------------------------------------------
    def check_health(self) -> list[LostWorker]:
        """The workers lost since the last call, for :meth:`Recovery.recover`. Raises
        :class:`HostLost` for a host that reported an error or went silent while its worker is
        still there, and for a lost worker when ``run.max_restarts`` is 0."""
        now = time.time()
        if not self._said_ready:
            self._say_ready()
        lost: list[LostWorker] = []
        if self._expected and (now >= self._next_worker_check or self._errors):
            self._next_worker_check = now + WORKER_CHECK_S
            lost = self.lost_workers(self._expected)
        if lost:
            if self.cfg.run.max_restarts == 0:
                raise HostLost(lost[0].describe())
            return lost
        if self._errors:
            t, key, error = self._errors[0]
            # a host on a worker that is about to be seen lost (a buffer's senders, a peer rank)
            # fails first: give the scheduler a moment to say so
            if self.cfg.run.max_restarts == 0 or now - t > ERROR_GRACE_S:
                raise HostLost(error)
        timeout = self.cfg.run.heartbeat_timeout
        for key, where in self._expected.items():
            last = self._last_rx.get(key)
            if last is None:
                if now - self._host_started.get(key, self._started_at) > self._startup_grace_s:
                    raise HostLost(
                        f"{key[0]} {key[1]} on {where}: no heartbeat within {self._startup_grace_s:g} s of "
                        "starting (tianji.timeouts.host-startup)"
                    )
            elif now - last > timeout:
                raise HostLost(
                    f"{key[0]} {key[1]} on {where}: no heartbeat for {now - last:.1f} s "
                    f"(run.heartbeat_timeout={timeout} s): its worker process died or its loop is stuck"
                )
        return []

    def lost_workers(self, expected: dict[Key, str]) -> list[LostWorker]:
        """The workers of ``expected`` (host -> worker) that are no longer in the cluster."""
        present = set(scheduler_workers(self.client))
        lost = []
        for where in sorted(set(expected.values()) - present):
            hosts = tuple(k for k, w in sorted(expected.items()) if w == where)
            cause = removal_reason(self.client, where) + death_reasons(self._deaths_since)
            lost.append(LostWorker(where, hosts, cause))
        if lost:  # a later loss quotes only what the nannies said after this one
            self._deaths_since = time.time()
        return lost

    def lost_while_building(self, expected: dict[Key, str]) -> list[LostWorker]:
        """The workers lost while the hosts were built. A host's creation or call may fail as its
        worker dies a moment before the scheduler says it left: that gets ``ERROR_GRACE_S``."""
        deadline = time.monotonic() + ERROR_GRACE_S
        while not (lost := self.lost_workers(expected)) and time.monotonic() < deadline:
            time.sleep(ERROR_GRACE_POLL_S)
        return lost

    def _say_ready(self) -> None:
        """Once every host the run started with has begun its loop: how long each role took
        (the slowest host of each), from its loop thread's start, and of that how long building
        the role took (a learner's network; an actor's envs and policy, and of that its envs): the
        rest of an actor's is its wait for the first parameters."""
        if self.hosts is None or not self.hosts.handles:
            return
        beats = {key: self._last_hb.get(key, {}) for key in self.hosts.handles}
        if any(hb.get("ready_s") is None for hb in beats.values()):
            return
        self._said_ready = True
        slowest: dict[str, tuple[float, float, int]] = {}
        for (role, hid), hb in beats.items():
            mine = (float(hb["ready_s"]), float(hb.get("built_s") or 0.0), hid)
            slowest[role] = max(slowest.get(role, mine), mine)
        parts = []
        for role, (s, b, hid) in sorted(slowest.items(), key=lambda kv: kv[1]):
            of_it = "".join(
                f", its {part} {t:.1f} s" for part, t in (beats[role, hid].get("build_parts") or {}).items()
            )
            parts.append(f"{role} {hid} in {s:.1f} s (built in {b:.1f} s{of_it})")
        self._on_event("hosts ready (the slowest of each role): " + ", ".join(parts))
