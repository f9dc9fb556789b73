"""One run's hosts on a Dask cluster: placement, wiring, heartbeats, health, shutdown.

:class:`RunCluster` is a context manager used by the driver. On entry it uses the
given client or starts a ``LocalCluster`` (127.0.0.1, one single-threaded worker
process per actor plus one for the buffer and learner); on exit it releases
every host and closes what it started, whatever happened in between.
"""

from __future__ import annotations

import collections
import logging
import math
import os
import threading
import time
from typing import TYPE_CHECKING

import psutil
from distributed import LocalCluster

from tianji_dask.channels import ChannelPlugin
from tianji_dask.deployment import deployment_settings
from tianji_dask.hosts import ActorHost, BufferHost, LearnerHost, metrics_topic, stop_event_name
from tianji_dask.placement import place
from tianji_dask.worker_signals import spawned_ignoring_driver_signals
from tianji_dask.workers import scheduler_workers

if TYPE_CHECKING:
    from tianji_dask.config.schema import ExperimentConfig

STOP_TIMEOUT_S = 10.0
HURRY_POLL_S = 0.2  # how soon a host stop being waited for notices the run was told to hurry
WORKER_CHECK_S = 1.0  # how often the run asks the scheduler whether its hosts' workers are still there


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


class HostLost(RuntimeError):
    """A host stopped sending heartbeats or reported an error; the message says which."""


class TianjiLocalCluster(LocalCluster):
    """A LocalCluster whose ``close()`` (and ``with`` exit) also ends any worker process still
    alive: its workers ignore SIGTERM, so one left running would also hang multiprocessing's exit
    handler."""

    def close(self, timeout: float | None = None):
        pids = [n.pid for n in self.workers.values() if getattr(n, "pid", None)]
        try:
            return super().close(timeout)
        finally:
            for pid in pids:
                kill_and_reap(pid)


def local_cluster(
    n_workers: int, *, dashboard: bool = True, preload_roles: bool = True, security=None
) -> TianjiLocalCluster:
    """The LocalCluster of tianji-dask's runs, profiles and benchmarks: loopback only, one
    single-threaded worker process each, workers that leave SIGINT and SIGTERM to the driver.

    ``preload_roles``: the workers import torch, gymnasium and the roles as they start
    (``tianji_dask.worker_preload``); the channel benchmark, which measures the transport alone,
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
    # (tianji_dask.worker_signals).
    preload = ["tianji_dask.worker_signals", *(["tianji_dask.worker_preload"] if preload_roles else [])]
    with spawned_ignoring_driver_signals():
        return TianjiLocalCluster(
            n_workers=n_workers,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=deployment_settings().local_cluster.dashboard_address if dashboard else None,
            memory_limit=MEMORY_LIMIT,
            preload=preload,
            **({"protocol": "tls://", "security": security} if security is not None else {}),
        )


def kill_and_reap(pid: int) -> None:
    try:
        proc = psutil.Process(pid)
        if proc.ppid() != os.getpid():  # a recycled pid: not ours
            return
        proc.kill()
        proc.wait(5)
    except (psutil.NoSuchProcess, psutil.TimeoutExpired, ChildProcessError):
        pass


class RunCluster:
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
        self._own_cluster = None
        self._on_event = on_event
        self._futures: list = []
        self.buffer = self.learner = None
        self.actors: list = []
        self.learners: list = []
        self.buffers: list = []
        self._expected: dict[tuple[str, int], str] = {}
        self._last_rx: dict[tuple[str, int], float] = {}
        self._errors: list[str] = []
        self._final: list[dict] = []
        self._subscribed = False
        self._started_at = time.time()
        self._startup_grace_s = deployment_settings().timeouts.host_startup
        self._next_worker_check = 0.0

    # --- lifecycle ----------------------------------------------------------------------
    def __enter__(self) -> RunCluster:
        _watch_worker_deaths()
        if self.client is None:
            from distributed import Client

            t = self.cfg.topology
            self._own_cluster = local_cluster(t.groups * (t.actors + t.learners), security=self._security)
            self.client = Client(self._own_cluster, security=self._security)
        # An actor handle binds to the process's current client when it arrives; any Client made
        # in this process since, even one that failed to connect, would otherwise be that one.
        self._as_current = self.client.as_current()
        self._as_current.__enter__()
        self.dashboard_link = self.client.dashboard_link
        self.scheduler_address = self.client.scheduler.address
        self._on_event(f"scheduler: {self.scheduler_address}")
        self._on_event(f"dashboard: {self.dashboard_link}")
        self.client.register_plugin(ChannelPlugin())
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self._subscribed:
                self.client.unsubscribe_topic(metrics_topic(self.run_id))
            if self._futures:
                self.client.cancel(self._futures)
                from distributed import Event

                Event(stop_event_name(self.run_id), client=self.client).clear()
            self._futures.clear()
            self.buffer = self.learner = None
            self.actors, self.learners, self.buffers = [], [], []
        finally:
            self._as_current.__exit__(None, None, None)
            if self._own_cluster is not None:
                self.client.close()
                self._own_cluster.close()

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

    def _death_reasons(self) -> str:
        """What the nannies in this process said about workers that ended during the run
        (LocalClusters only: a remote nanny logs on its own host). The nanny may notice a
        moment after the scheduler does."""
        deadline = time.time() + 1.0
        while not (said := _WORKER_DEATHS.since(self._started_at)) and time.time() < deadline:
            time.sleep(0.05)
        return f"; Dask's nanny: {'; '.join(said)}" if said else ""

    # --- heartbeats -----------------------------------------------------------------------
    def subscribe(self, on_heartbeat) -> None:
        def handler(event):
            _, hb = event
            key = (hb.get("role"), hb.get("id"))
            self._last_rx[key] = time.time()
            if hb.get("error"):
                self._errors.append(hb["error"])
            on_heartbeat(hb)

        self.client.subscribe_topic(metrics_topic(self.run_id), handler)
        self._subscribed = True

    def check_health(self) -> None:
        """Raise :class:`HostLost` if a host reported an error or went silent."""
        if self._errors:
            raise HostLost(self._errors[0])
        now = time.time()
        if self._expected and now >= self._next_worker_check:
            self._next_worker_check = now + WORKER_CHECK_S
            present = set(scheduler_workers(self.client))
            for key, where in self._expected.items():
                if where not in present:  # no need to wait for heartbeats (nor the start-up grace)
                    raise HostLost(
                        f"{key[0]} {key[1]} on {where}: its worker left the cluster "
                        "(the process died, or its batch job ended or was cancelled)"
                        + self._removal_reason(where)
                        + self._death_reasons()
                    )
        timeout = self.cfg.run.heartbeat_timeout
        for key, where in self._expected.items():
            last = self._last_rx.get(key)
            if last is None:
                if now - self._started_at > self._startup_grace_s:
                    raise HostLost(
                        f"{key[0]} {key[1]} on {where}: no heartbeat within {self._startup_grace_s:g} s of "
                        "starting (tianji.timeouts.host-startup)"
                    )
            elif now - last > timeout:
                raise HostLost(
                    f"{key[0]} {key[1]} on {where}: no heartbeat for {now - last:.1f} s "
                    f"(run.heartbeat_timeout={timeout} s): its worker process died or its loop is stuck"
                )

    # --- hosts ----------------------------------------------------------------------------
    def _submit(self, cls, *args, worker: str, **kwargs):
        fut = self.client.submit(
            cls, *args, **kwargs, actor=True, workers=[worker], allow_other_workers=False, pure=False
        )
        self._futures.append(fut)
        return fut

    def start_hosts(self, spaces) -> None:
        """Create and wire all hosts of all groups where :func:`placement.place` puts them,
        then start their loops. Inboxes are opened in constructors, before anything is sent to
        them: buffers and actors first, learners last (rank 0 of each group first, for its port).
        """
        cfg, rid = self.cfg, self.run_id
        cfg_json = cfg.to_json()
        obs = spaces.observation_space
        obs_dim = int(math.prod(obs.shape))
        n_actions = int(spaces.action_space.n)
        workers = scheduler_workers(self.client)
        plan = place(workers, cfg.topology, rid, cfg.seed)
        if plan.workers_shared:
            n_hosts = len(plan.learners) + len(plan.actors)
            self._on_event(f"{len(workers)} workers for {n_hosts} host processes: hosts will share workers")
        futures = []
        buffer_futures = {}
        for group in range(cfg.topology.groups):  # each group's buffers, then its actors
            for lp in (p for p in plan.learners if p.group == group):
                buffer_futures[lp.id] = self._submit(
                    BufferHost,
                    rid,
                    cfg_json,
                    lp.id,
                    lp.buffer_seed,
                    lp.trajectories,
                    tuple(obs.shape),
                    "float32",
                    len(lp.feeders),
                    worker=lp.worker,
                )
                futures.append(buffer_futures[lp.id])
            for ap in (p for p in plan.actors if p.group == group):
                futures.append(
                    self._submit(
                        ActorHost,
                        rid,
                        cfg_json,
                        ap.id,
                        ap.seed,
                        ap.buffer_worker,
                        ap.trajectories,
                        ap.parameters,
                        worker=ap.worker,
                    )
                )
        hosts = [f.result() for f in futures]
        per_group = cfg.topology.learners + cfg.topology.actors
        self.buffers = [hosts[k] for k in range(len(hosts)) if k % per_group < cfg.topology.learners]
        self.actors = [hosts[k] for k in range(len(hosts)) if k % per_group >= cfg.topology.learners]
        self.learners = []
        store = None
        for lp in plan.learners:  # by global id: rank 0 of each group first
            if lp.rank == 0:
                store = None
            lead_host = self._submit(
                LearnerHost,
                rid,
                cfg_json,
                lp.id,
                lp.learner_seed,
                list(lp.subscribers),
                obs_dim,
                n_actions,
                buffer_futures[lp.id].result(),
                rank=lp.rank,
                world_size=cfg.topology.learners,
                store_address=store,
                gossip_peers=lp.gossip,
                worker=lp.worker,
            ).result()
            if lp.rank == 0 and cfg.topology.learners > 1:
                store = lead_host.rendezvous_address().result()
            self.learners.append(lead_host)
        self.learner = self.learners[0]
        self.buffer = self.buffers[0]
        self._expected = plan.host_workers()
        self.worker_addresses = sorted(set(self._expected.values()))
        self._started_at = time.time()
        for host in [*self.buffers, *self.learners, *self.actors]:
            host.start().result()

    def stop_hosts(self) -> None:
        """Stop every loop; hosts that are gone are skipped. Keeps their last heartbeats."""
        hosts = [*self.actors, *self.learners, *self.buffers]
        try:  # every loop sees the global stop at once; stop() below waits for each to finish
            from distributed import Event

            Event(stop_event_name(self.run_id), client=self.client).set()
        except Exception as exc:  # noqa: BLE001
            self._on_event(f"could not set the global stop event: {exc!r}")
        pending = []
        for h in hosts:
            try:
                pending.append(h.stop(STOP_TIMEOUT_S))
            except Exception as exc:  # noqa: BLE001 - a lost worker's host cannot be reached
                self._on_event(f"could not stop a host: {exc!r}")
        deadline = time.monotonic() + STOP_TIMEOUT_S + 2
        for fut in pending:
            try:
                hb = self._result_unless_hurried(fut, deadline)
                if hb:
                    self._final.append({**hb, "episodes": []})  # episodes already came by heartbeat
            except Exception as exc:  # noqa: BLE001
                self._on_event(f"a host did not stop cleanly: {exc!r}")
        if not self._hurry.is_set():
            time.sleep(2 * 0.05 + 0.2)  # let the final log_event heartbeats reach the client

    def _result_unless_hurried(self, fut, deadline: float):
        """``fut.result()`` until ``deadline``; None at once when the run is told to hurry."""
        while not self._hurry.is_set():
            try:
                return fut.result(timeout=max(0.01, min(HURRY_POLL_S, deadline - time.monotonic())))
            except TimeoutError:
                if time.monotonic() >= deadline:
                    raise
        return None

    def final_heartbeats(self) -> list[dict]:
        return list(self._final)

    def learner_checkpoint(self, timeout: float = 60.0) -> tuple[dict, dict] | None:
        """The learner's final state; None if the run stopped before the learner was built."""
        return self.learner.checkpoint().result(timeout=timeout)

    def learner_snapshot(self) -> tuple[dict, dict]:
        """The learner's state while it trains (a periodic checkpoint), as CPU tensors."""
        return self.learner.snapshot().result(timeout=90)
