"""One run's hosts on a Dask cluster: placement, wiring, heartbeats, health, shutdown.

:class:`RunCluster` is a context manager used by the driver. On entry it uses the
given client or starts a ``LocalCluster`` (127.0.0.1, one single-threaded worker
process per actor plus one for the buffer and learner); on exit it releases
every host and closes what it started, whatever happened in between.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psutil
from distributed import LocalCluster, Nanny
from distributed.deploy.spec import SpecCluster

from tianji_dask.algos.registry import spec_for
from tianji_dask.channels import ChannelPlugin
from tianji_dask.config.deployment import deployment_settings
from tianji_dask.roles.replay_state import ReplayState, merged
from tianji_dask.runtime.client_context import current_client
from tianji_dask.runtime.forked_workers import ForkedNanny, start_fork_server
from tianji_dask.runtime.hosts import metrics_topic, stop_event_name
from tianji_dask.runtime.restarts import HostLost, Key, LostWorker, RestartPolicy, lost_with, replay_lost
from tianji_dask.runtime.run_hosts import RunHosts
from tianji_dask.runtime.worker_signals import spawned_ignoring_driver_signals
from tianji_dask.runtime.workers import scheduler_workers

if TYPE_CHECKING:
    from tianji_dask.config.schema import ExperimentConfig

WORKER_CHECK_S = 1.0  # how often the run asks the scheduler whether its hosts' workers are still there
ERROR_GRACE_S = 3.0  # how long a host's error waits for a lost worker that explains it
SNAPSHOT_TIMEOUT_S = 30.0
RANK_RESTART_S = 10.0
RECREATE_TRIES = 3  # a re-creation that failed while its workers are all still there is tried again
CLUSTER_START_TRIES = 3  # a LocalCluster whose worker process died while it started is started again


class LearnerLost(RuntimeError):
    """The learner's worker was lost as the run stopped, before its final state was taken."""


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else repr(exc)


class _WorkerDeaths(logging.Handler):
    """Dask's nannies log why a worker process ended ("killed by signal 9", "exited with status
    1") at INFO, which LocalCluster's log silencing hides; a lost-host report quotes them."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.messages: collections.deque[tuple[float, str]] = collections.deque(maxlen=32)

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if msg.startswith("Worker process"):
            self.messages.append((record.created, msg))

    def since(self, t: float) -> list[str]:
        return [m for created, m in list(self.messages) if created >= t]


_WORKER_DEATHS = _WorkerDeaths()


def _watch_worker_deaths() -> None:
    nanny_log = logging.getLogger("distributed.nanny")
    if _WORKER_DEATHS not in nanny_log.handlers:
        nanny_log.addHandler(_WORKER_DEATHS)


class TianjiLocalCluster(LocalCluster):
    """A LocalCluster whose ``close()`` (and ``with`` exit) also ends any worker process still
    alive: its workers ignore SIGTERM, so one left running would also hang multiprocessing's exit
    handler; and whose nannies are never closed for a worker that left."""

    def _update_worker_status(self, op, msg):
        # SpecCluster closes a worker's nanny when, distributed.deploy.lost-worker-timeout (15 s)
        # after the worker left, no worker of its name is registered at that instant. A nanny
        # whose restarted worker was lost again is then restarting it once more, and closing it
        # would lose that worker for good. The nannies restart their workers; the run decides
        # what a lost worker means (restarts.RestartPolicy).
        return super(SpecCluster, self)._update_worker_status(op, msg)  # Cluster's: the bookkeeping only

    def close(self, timeout: float | None = None):
        processes = [p for n in self.workers.values() if (p := _process(getattr(n, "pid", None)))]
        try:
            return super().close(timeout)
        finally:
            for proc in processes:
                kill_and_reap(proc)


def local_cluster(
    n_workers: int, *, dashboard: bool = True, preload_roles: bool = True, security=None
) -> TianjiLocalCluster:
    """The LocalCluster of tianji-dask's runs, profiles and benchmarks: loopback only, one
    single-threaded worker process each, workers that leave SIGINT and SIGTERM to the driver.

    ``preload_roles``: the workers import torch, gymnasium and the roles as they start
    (``tianji_dask.runtime.worker_preload``); the channel benchmark, which measures the transport alone,
    leaves them out. ``security`` (a ``distributed.Security``): scheduler, workers and nannies
    listen on tls:// only, with its certificates; the project's channels answer on the workers'
    own listeners, so they are TLS too."""
    from distributed.system import MEMORY_LIMIT

    # Dask's MALLOC_TRIM_THRESHOLD_ stays: it costs 20-40 % on receives of 512 KiB messages
    # (shared/notes/dask_mechanics.md), but CartPole chunks are 12 KB, and without it the
    # learner's process held 402 MB instead of 362 MB (the 400 MB per-host budget).
    # Dask's default memory limit splits the machine evenly between workers, and its nanny kills
    # a worker past 95 % of its share. The roles are not even: one buffer may hold a replay of
    # most of the machine (Pong's 7.2 GB) beside actors of 0.6 GB, so each worker may use it all
    # (the run checks before it starts that the replay fits: driver.check_replay_fits).
    # The workers leave SIGINT and SIGTERM to the driver from their first instruction on
    # (tianji_dask.runtime.worker_signals).
    # Their processes fork from a server that imported the roles (tianji_dask.runtime.forked_workers);
    # the channel benchmark's spawn without importing them.
    preload = ["tianji_dask.runtime.worker_signals", *(["tianji_dask.runtime.worker_preload"] if preload_roles else [])]
    if preload_roles:
        start_fork_server()
    with spawned_ignoring_driver_signals():
        return TianjiLocalCluster(
            n_workers=n_workers,
            worker_class=ForkedNanny if preload_roles else Nanny,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=deployment_settings().local_cluster.dashboard_address if dashboard else None,
            memory_limit=MEMORY_LIMIT,
            preload=preload,
            **({"protocol": "tls://", "security": security} if security is not None else {}),
        )


def _placed(host_workers: dict[Key, str]) -> str:
    """``buffer 0, learner 0 on tcp://...; actor 0 on tcp://...``: each worker's hosts."""
    by_worker: dict[str, list[str]] = {}
    for (role, hid), worker in sorted(host_workers.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        by_worker.setdefault(worker, []).append(f"{role} {hid}")
    return "; ".join(f"{', '.join(keys)} on {worker}" for worker, keys in by_worker.items())


def _process(pid: int | None) -> psutil.Process | None:
    """The running process ``pid``, or None (no pid, or it has ended)."""
    if not pid:
        return None
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


def kill_and_reap(proc: psutil.Process) -> None:
    """Kill a worker process if it still runs (psutil knows the process by pid and start time:
    a recycled pid is another process, left alone) and wait for it to end."""
    try:
        if not proc.is_running():
            return
        proc.kill()
        proc.wait(5)
    except (psutil.NoSuchProcess, psutil.TimeoutExpired, ChildProcessError):
        pass


class RunCluster:
    """One run's cluster and hosts for the driver: a context manager (see the module docstring);
    :meth:`check_health` and :meth:`recover` keep the hosts alive, :meth:`take_snapshots` keeps
    each group's newest learner state for the learners :meth:`recover` re-creates."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        client,
        run_id: str,
        on_event=lambda text: None,
        *,
        hurry: threading.Event | None = None,
        security=None,
    ):
        self.cfg = cfg
        self._security = security  # with no client: the own LocalCluster's TLS certificates
        self._hurry = hurry or threading.Event()  # set: stop without waiting for the hosts
        self.run_id = run_id
        self.client = client
        self._own_cluster: TianjiLocalCluster | None = None
        self._on_event = on_event
        self.hosts: RunHosts | None = None
        self._expected: dict[Key, str] = {}
        self._last_rx: dict[Key, float] = {}
        self._last_hb: dict[Key, dict] = {}
        self._errors: list[tuple[float, Key, str]] = []
        self._final: list[dict] = []
        self._subscribed = False
        self._started_at = time.time()
        self._host_started: dict[Key, float] = {}
        self._startup_grace_s = deployment_settings().timeouts.host_startup
        self._next_worker_check = 0.0
        self._deaths_since = time.time()
        self._policy = RestartPolicy(cfg.run.max_restarts, cfg.run.restart_window_s)
        self._snapshots: dict[int, tuple[bytes, dict]] = {}  # group -> its lead learner's (packed state, meta)
        # (group, learner id) -> the snapshot asked for and not yet kept, and its buffer's incarnation
        self._pending_snapshots: dict[tuple[int, int], tuple[Any, int]] = {}
        self._snapshots_asked = 0.0
        self._said_ready = False  # the hosts' start-up times, said once
        # buffer id -> its replay's newest full state, and the buffer's incarnation it came from
        self._replays: dict[int, tuple[ReplayState, int]] = {}
        self._replay_too_big: set[int] = set()  # buffers whose replay outgrew run.replay_snapshot_mb (said once)

    # --- lifecycle ----------------------------------------------------------------------
    def __enter__(self) -> RunCluster:
        _watch_worker_deaths()
        if self.client is None:
            from distributed import Client

            began = time.monotonic()
            self._own_cluster = self._start_local_cluster()
            self.client = Client(self._own_cluster, security=self._security, set_as_default=False)
            self._on_event(f"LocalCluster of {self._own_workers()} workers started in {time.monotonic() - began:.1f} s")
        # An actor handle binds to the process's current client when it arrives; any Client made
        # in this process since, even one that failed to connect, would otherwise be that one.
        self._current_client = current_client(self.client)
        self._current_client.__enter__()
        self.dashboard_link = self.client.dashboard_link
        self.scheduler_address = self.client.scheduler.address
        self._on_event(f"scheduler: {self.scheduler_address}")
        self._on_event(f"dashboard: {self.dashboard_link}")
        self.client.register_plugin(ChannelPlugin())
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._unsubscribe()
            futures = self.hosts.futures() if self.hosts is not None else []
            if futures:
                self.client.cancel(futures)
                from distributed import Event

                Event(stop_event_name(self.run_id), client=self.client).clear()
            self.hosts = None
        finally:
            self._current_client.__exit__(None, None, None)
            if self._own_cluster is not None:
                self.client.close()
                self._own_cluster.close()

    def _own_workers(self) -> int:
        t = self.cfg.topology
        return t.groups * (t.actors + t.learners)

    def _start_local_cluster(self) -> TianjiLocalCluster:
        """The run's LocalCluster. A worker process that dies while it starts (killed, out of
        memory) makes Dask's nanny, and with it the whole LocalCluster, fail to start (Dask closes
        what it had made); it is started again, up to ``CLUSTER_START_TRIES`` times in all (once
        with ``run.max_restarts: 0``), and then the run fails with the cause in one line."""
        n = self._own_workers()
        tries = CLUSTER_START_TRIES if self.cfg.run.max_restarts > 0 else 1
        for attempt in range(1, tries + 1):
            since = time.time()
            try:
                return local_cluster(n, security=self._security)
            except Exception as exc:  # noqa: BLE001 - Dask raises plain RuntimeErrors here
                why = f"{type(exc).__name__}: {_first_line(exc)}{self._death_reasons(since, wait_s=0.5)}"
            if attempt == tries or self._hurry.is_set():
                raise HostLost(f"the run's LocalCluster of {n} workers did not start in {attempt} tries: {why}")
            self._on_event(
                f"the run's LocalCluster did not start ({why}); starting it again (try {attempt + 1} of {tries})"
            )
        raise AssertionError("unreachable")

    def _removal_reason(self, where: str) -> str:
        """The scheduler's own record of why it removed the worker (its stimulus id names the
        cause: a closed connection, a missed heartbeat TTL, a retirement...)."""
        try:
            events = self.client.get_events(where)
        except Exception:  # noqa: BLE001 - the report must not fail for want of detail
            return ""
        why = [
            msg.get("stimulus_id", "?")
            for _, msg in events
            if isinstance(msg, dict) and msg.get("action") == "remove-worker"
        ]
        return f"; the scheduler removed it ({why[-1]})" if why else ""

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

    def _death_reasons(self, since: float, wait_s: float = 1.0) -> str:
        """What the nannies in this process said about workers that ended since ``since``
        (LocalClusters only: a remote nanny logs on its own host). The nanny may notice a
        moment after the scheduler does."""
        deadline = time.time() + wait_s
        while not (said := _WORKER_DEATHS.since(since)) and time.time() < deadline:
            time.sleep(0.05)
        return f"; Dask's nanny: {'; '.join(said)}" if said else ""

    # --- heartbeats -----------------------------------------------------------------------
    def subscribe(self, on_heartbeat) -> None:
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

    def _unsubscribe(self) -> None:
        if self._subscribed:
            self.client.unsubscribe_topic(metrics_topic(self.run_id))
            self._subscribed = False

    def check_health(self) -> list[LostWorker]:
        """The workers lost since the last call, for :meth:`recover`. Raises :class:`HostLost`
        for a host that reported an error or went silent while its worker is still there, and
        for a lost worker when ``run.max_restarts`` is 0."""
        now = time.time()
        if not self._said_ready:
            self._say_ready()
        lost: list[LostWorker] = []
        if self._expected and (now >= self._next_worker_check or self._errors):
            self._next_worker_check = now + WORKER_CHECK_S
            lost = self._lost_workers(self._expected)
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

    def _lost_workers(self, expected: dict[Key, str]) -> list[LostWorker]:
        """The workers of ``expected`` (host -> worker) that are no longer in the cluster."""
        present = set(scheduler_workers(self.client))
        lost = []
        for where in sorted(set(expected.values()) - present):
            hosts = tuple(k for k, w in sorted(expected.items()) if w == where)
            cause = self._removal_reason(where) + self._death_reasons(self._deaths_since)
            lost.append(LostWorker(where, hosts, cause))
        if lost:  # a later loss quotes only what the nannies said after this one
            self._deaths_since = time.time()
        return lost

    # --- hosts ----------------------------------------------------------------------------
    @property
    def learner(self):
        """The handle of group 0's lead learner (the one the run's checkpoints save)."""
        return self._built().lead(0)

    def _built(self) -> RunHosts:
        if self.hosts is None:
            raise RuntimeError("the run's hosts were used before they were started")
        return self.hosts

    def start_hosts(
        self,
        spaces,
        restore: bytes | None = None,
        prior: Callable[[Key, str], float] | None = None,
        *,
        totals: Callable[[str, int, str], float] = lambda role, hid, counter: 0.0,
        add_heartbeat: Callable[[dict], None] = lambda hb: None,
    ) -> None:
        """Create and wire all hosts of all groups where :func:`placement.place` puts them,
        then start their loops (:class:`~tianji_dask.runtime.run_hosts.RunHosts`); ``restore`` and
        ``prior`` continue a run (:meth:`RunHosts.build_all`).

        A worker lost meanwhile, as the restart policy admits it: every host made so far is
        stopped and released, the lost worker's hosts move to the worker that takes its place
        (:meth:`RunHosts.replacement`), and all are built again (``totals`` and
        ``add_heartbeat`` as for :meth:`recover`: hosts that had started carry their counts)."""
        if self._own_cluster is not None:
            self._wait_for_own_workers()
        hosts = RunHosts(self.client, self.cfg, self.run_id, spaces, self._on_event, self._hurry)
        self.hosts = hosts
        plan = hosts.place_all()
        if plan.workers_shared:
            t = self.cfg.topology
            n_hosts = t.groups * (t.learners + t.actors)
            self._on_event(f"{len(hosts.worker_names)} workers for {n_hosts} host processes: hosts will share workers")
        self._on_event("hosts placed: " + _placed(plan.host_workers()))
        given = prior or (lambda key, counter: 0)
        began = time.monotonic()

        def carried(key: Key, counter: str) -> float:
            return given(key, counter) + totals(key[0], key[1], counter)

        while True:
            try:
                hosts.build_all(restore, carried)
                break
            except Exception as exc:
                lost = self._lost_while_building(hosts.current_plan().host_workers())
                if not lost:
                    raise
                self._policy.admit(lost, time.time())  # too many: HostLost, the run fails
                what = f"{type(exc).__name__}: {_first_line(exc)}" if not isinstance(exc, HostLost) else ""
                for group in range(self.cfg.topology.groups):
                    self._stop_group(group, add_heartbeat)
                for w in lost:
                    new = hosts.replacement(w.address, self._startup_grace_s)
                    hosts.move(w.address, new)
                    self._on_event(
                        f"host lost while the hosts were created: {w.describe()}"
                        + (f" ({what})" if what else "")
                        + f"; re-creating them all, on {new} in its place"
                    )
        self._expected = hosts.current_plan().host_workers()
        self.worker_addresses = sorted(set(self._expected.values()))
        self._started_at = self._deaths_since = time.time()
        self._on_event(f"{len(self._expected)} hosts created and started in {time.monotonic() - began:.1f} s")

    def _wait_for_own_workers(self) -> None:
        """The run's own LocalCluster with all its workers before the hosts are placed: one
        killed since it started comes back under its name (its nanny restarts it). One that does
        not come back within the start-up grace leaves its hosts to share the others."""
        n = self._own_workers()
        with contextlib.suppress(TimeoutError):
            self.client.wait_for_workers(n, timeout=self._startup_grace_s)

    def _lost_while_building(self, expected: dict[Key, str]) -> list[LostWorker]:
        """The workers lost while the hosts were built. A host's creation or call may fail as its
        worker dies a moment before the scheduler says it left: that gets ``ERROR_GRACE_S``."""
        deadline = time.monotonic() + ERROR_GRACE_S
        while not (lost := self._lost_workers(expected)) and time.monotonic() < deadline:
            time.sleep(0.1)
        return lost

    def recover(self, lost: list[LostWorker], totals: Callable[[str, int, str], float], add_heartbeat) -> dict:
        """Re-create the hosts of the lost workers (the module docstring of
        :mod:`~tianji_dask.runtime.run_hosts` says how); raises :class:`HostLost` when the restart
        policy does not admit it. ``totals(role, id, counter)``: a host's cumulative counter
        over its incarnations (the recorder's); ``add_heartbeat`` records the last heartbeats of
        hosts stopped for a rebuild. Returns the loss counts (``results.LOSS_KEYS``)."""
        hosts, t = self._built(), self.cfg.topology
        self._policy.admit(lost, time.time())
        counts: collections.Counter[str] = collections.Counter()
        keys = [k for w in lost for k in w.hosts]
        for key in keys:
            if key[0] != "buffer":  # a buffer's loss is counted with its group's rebuild, below
                counts.update(
                    lost_with(key[0], (self._last_hb.get(key) or {}).get("counters", {}), self.cfg.env.num_envs)
                )
        groups = sorted({hosts.group_of(k) for k in keys if k[0] != "actor"})
        actors = sorted(k[1] for k in keys if k[0] == "actor" and hosts.group_of(k) not in groups)
        timeout = self._startup_grace_s
        for w in lost:
            new = hosts.replacement(w.address, timeout)
            hosts.move(w.address, new)
            self._on_event(f"host lost: {w.describe()}; re-creating on {new}")

        def prior(key: Key, counter: str) -> float:
            return totals(key[0], key[1], counter)

        for group in groups:
            self._forget_pending_snapshots(group)
            last_hb = {k: self._last_hb.get(k) or {} for k in hosts.group_keys(group)}
            for hb in hosts.stop_group(group):
                add_heartbeat(hb)
                last_hb[(hb["role"], hb["id"])] = hb
                if hb["role"] == "actor" and (hb["role"], hb["id"]) not in keys:  # stopped, not lost
                    counts.update(lost_with("actor", hb.get("counters", {}), self.cfg.env.num_envs))
            replays = {}
            for lid in range(group * t.learners, (group + 1) * t.learners):
                kept = self._replays.get(lid)
                if kept is not None:
                    replays[lid] = kept[0]
                counts.update(replay_lost(last_hb[("buffer", lid)], kept))
            if t.learners > 1:
                self._restart_surviving_ranks(group, timeout)
            restore = self._snapshots.get(group)
            # the newest version the group published: its lead's last heartbeat, or an actor's if newer
            last_version = max(
                (self._last_hb.get(k) or {}).get("counters", {}).get("param_version", -1)
                for k in hosts.group_keys(group)
                if k[0] != "buffer"
            )
            restored_updates = int(restore[1].get("updates", 0)) if restore is not None else 0
            counts["lost_updates"] += max(0, int(last_version) - restored_updates)
            counts["buffer_restarts"] += t.learners
            counts["learner_restarts"] += t.learners
            counts["actor_restarts"] += t.actors
            rebuilt = self._unless_lost_again(
                f"group {group}",
                hosts.group_keys(group),
                functools.partial(
                    hosts.build_group_again,
                    group,
                    restore[0] if restore is not None else None,
                    prior,
                    replays=replays,
                ),
                undo=functools.partial(self._stop_group, group, add_heartbeat),
            )
            if rebuilt:
                self._on_event(
                    f"group {group}: its learner goes on from its snapshot at update {restored_updates:,}"
                    if restore is not None
                    else f"group {group}: its learner starts again from nothing (no snapshot was taken yet)"
                )
            if rebuilt and replays:
                restored = sum(r.transitions for r in replays.values())
                counts["restored_replay"] += restored
                self._on_event(f"group {group}: its buffers start with {restored:,} transitions of replay kept here")
        for actor_id in actors:
            counts["actor_restarts"] += 1
            self._unless_lost_again(
                f"actor {actor_id}",
                [("actor", actor_id)],
                functools.partial(hosts.recreate_actor, actor_id, prior),
            )
        recreated = {k for g in groups for k in hosts.group_keys(g)} | {("actor", a) for a in actors}
        now = time.time()
        for key in recreated:
            self._last_rx.pop(key, None)
            self._host_started[key] = now
        self._errors = [e for e in self._errors if e[1] not in recreated]
        self._expected = hosts.current_plan().host_workers()
        self.worker_addresses = sorted(set(self._expected.values()))
        return dict(counts)

    def _stop_group(self, group: int, add_heartbeat: Callable[[dict], None]) -> None:
        """Stop and release a group's hosts, recording their last heartbeats."""
        for hb in self._built().stop_group(group):
            add_heartbeat(hb)

    def _restart_surviving_ranks(self, group: int, timeout: float) -> None:
        """A data-parallel rank that lost its peer may be stuck in a collective, and
        torch.distributed's process group is one per process: the worker processes of the
        group's surviving ranks start again (their nannies restart them) before the new
        rendezvous."""
        hosts = self._built()
        plan, present = hosts.current_plan(), set(scheduler_workers(self.client))
        survivors = sorted({p.worker for p in plan.learners if p.group == group and p.worker in present})
        if not survivors:
            return
        self._on_event(f"restarting the workers of group {group}'s surviving data-parallel ranks: {survivors}")
        with contextlib.suppress(Exception):  # a worker that does not come back is handled below
            # a short timeout: a rank stuck in a collective never closes gracefully, it is killed
            self.client.restart_workers(survivors, timeout=RANK_RESTART_S, raise_for_error=False)
        for address in survivors:
            hosts.move(address, hosts.replacement(address, timeout))

    def _unless_lost_again(
        self, what: str, keys: list[Key], recreate: Callable[[], None], undo: Callable[[], None] = lambda: None
    ) -> bool:
        """Run one re-creation of the hosts ``keys``; True if it finished. One that failed while
        their workers are all still there (the scheduler cancelled a host's task, a call to a
        host failed) is tried again, after ``undo`` released what the failed try made, up to
        ``RECREATE_TRIES`` in all: it is still one restart. If a worker it needs is lost
        meanwhile (or the tries run out), say so and go on: its hosts stay expected on the
        plan's workers, so the next :meth:`check_health` reports that worker lost (and the
        policy counts it) or, if the worker is there, they get the start-up grace to send a
        heartbeat."""
        for attempt in range(1, RECREATE_TRIES + 1):
            try:
                recreate()
                return True
            except Exception as exc:  # noqa: BLE001 - the run goes on; supervision decides what it means
                why = _first_line(exc)
                needed = {self._built().current_plan().host_workers()[k] for k in keys}
                lost = needed - set(scheduler_workers(self.client))
                if attempt == RECREATE_TRIES or self._hurry.is_set() or lost:
                    self._on_event(f"re-creating {what} did not finish: {why}")
                    return False
                self._on_event(
                    f"re-creating {what} did not finish ({why}) while its workers are all there: "
                    f"trying again ({attempt + 1} of {RECREATE_TRIES})"
                )
                undo()
        return False

    def take_snapshots(self) -> None:
        """Ask each group's learners for their newest state, to keep in this process for
        :meth:`recover`, and with it each buffer's replay (up to ``run.replay_snapshot_mb``;
        after the first copy a buffer sends only what it added since: :mod:`~tianji_dask.roles.replay_state`).
        Returns at once: :meth:`collect_snapshots` keeps them as they arrive, so that a learner
        that cannot answer (a data-parallel rank stuck in a collective with a lost peer) does not
        hold up the supervision of the run. No new request while one is pending."""
        if self._pending_snapshots:
            return
        hosts, t = self._built(), self.cfg.topology
        max_bytes = int(self.cfg.run.replay_snapshot_mb * 1e6)
        with_replay = max_bytes > 0 and spec_for(self.cfg).keeps_replay
        for group in range(t.groups):
            for rank in range(t.learners):
                lid = group * t.learners + rank
                if rank > 0 and not with_replay:
                    continue  # only the lead's learner state is kept
                kept = self._replays.get(lid)
                replay = (kept[0].mark() if kept else None, max_bytes) if with_replay else None
                with contextlib.suppress(Exception):  # its worker was just lost: recover() comes next
                    self._pending_snapshots[(group, lid)] = (
                        hosts.handles[("learner", lid)].group_snapshot(rank == 0, replay),
                        hosts.incarnations[("buffer", lid)],
                    )
        self._snapshots_asked = time.monotonic()

    def collect_snapshots(self) -> None:
        """Keep the snapshots that have arrived; never waits. One that has not come within
        ``SNAPSHOT_TIMEOUT_S`` is given up, and the older one stays."""
        expired = time.monotonic() - self._snapshots_asked > SNAPSHOT_TIMEOUT_S
        max_bytes = int(self.cfg.run.replay_snapshot_mb * 1e6)
        for (group, lid), (fut, incarnation) in list(self._pending_snapshots.items()):
            if not fut.done() and not expired:
                continue
            del self._pending_snapshots[(group, lid)]
            if not fut.done():
                self._on_event(
                    f"learner snapshot of group {group}: none within {SNAPSHOT_TIMEOUT_S:g} s; the older one stays"
                )
                continue
            try:
                got = fut.result(timeout=SNAPSHOT_TIMEOUT_S)  # done: at once
            except Exception as exc:  # noqa: BLE001 - the run goes on; the older snapshot stays
                self._on_event(f"learner snapshot of group {group} failed: {exc!r}; the older one stays")
                continue
            if got["learner"] is not None:
                first = int(self._snapshots.get(group, ({}, {}))[1].get("updates", 0)) == 0
                self._snapshots[group] = got["learner"]
                updates = int(got["learner"][1].get("updates", 0))
                if first and updates > 0:
                    self._on_event(
                        f"group {group}: a lost learner can now be restored (first snapshot, at update {updates:,})"
                    )
            self._keep_replay(lid, got["replay"], got["replay_bytes"], incarnation, max_bytes)

    def _forget_pending_snapshots(self, group: int) -> None:
        """A group about to be rebuilt: what its old hosts may still send is not kept."""
        for key in [k for k in self._pending_snapshots if k[0] == group]:
            del self._pending_snapshots[key]

    def _keep_replay(self, lid: int, state: ReplayState | None, nbytes: int, incarnation: int, max_bytes: int) -> None:
        if state is None:
            if nbytes > max_bytes and lid not in self._replay_too_big:
                self._replay_too_big.add(lid)
                self._on_event(
                    f"replay of buffer {lid} holds {nbytes / 1e6:,.0f} MB, more than run.replay_snapshot_mb="
                    f"{self.cfg.run.replay_snapshot_mb:g}: no longer kept; if its worker is lost, its "
                    "re-created buffer starts empty"
                )
            if nbytes > max_bytes:
                self._replays.pop(lid, None)
            return
        kept = self._replays.get(lid)
        try:
            state = merged(kept[0], state) if kept is not None else state
        except ValueError as exc:  # not taken against what is kept: the next copy is a full one
            self._on_event(f"replay snapshot of buffer {lid}: {exc}; taking a full copy next time")
            self._replays.pop(lid, None)
            return
        if not state.full:
            self._replays.pop(lid, None)
            return
        self._replays[lid] = (state, incarnation)

    def stop_hosts(self) -> None:
        """Stop every loop; hosts that are gone are skipped. Keeps their last heartbeats
        (:meth:`final_heartbeats`); no heartbeat reaches the subscriber after it returns."""
        try:  # every loop sees the global stop at once; stop() below waits for each to finish
            from distributed import Event

            Event(stop_event_name(self.run_id), client=self.client).set()
        except Exception as exc:  # noqa: BLE001
            self._on_event(f"could not set the global stop event: {exc!r}")
        if self.hosts is not None:
            self._final.extend(self.hosts.stop_all())
        if not self._hurry.is_set():
            time.sleep(2 * 0.05 + 0.2)  # let the final log_event heartbeats reach the client
        self._unsubscribe()

    def final_heartbeats(self) -> list[dict]:
        return list(self._final)

    def learner_checkpoint(self, timeout: float = 60.0) -> tuple[bytes, dict] | None:
        """The learner's final state, packed (:func:`~tianji_dask.results.checkpoint.pack_state`). A
        learner lost as the run stopped gives its newest snapshot instead, if there is one; with
        none, :class:`LearnerLost`."""
        try:
            return self.learner.checkpoint().result(timeout=timeout)
        except Exception as exc:
            why = f"{type(exc).__name__}: {_first_line(exc)}"
            if 0 in self._snapshots:
                self._on_event(f"final checkpoint: the learner did not answer ({why}); saving its newest snapshot")
                return self._snapshots[0]
            lead = self._built().current_plan().learners[0].worker
            if self._lost_while_building({("learner", 0): lead}):
                raise LearnerLost(
                    f"the learner's worker {lead} was lost as the run stopped ({why}) and no snapshot was taken"
                ) from None
            raise

    def learner_snapshot(self) -> tuple[bytes, dict]:
        """The learner's state while it trains (a periodic checkpoint), packed."""
        return self.learner.snapshot().result(timeout=90)
