"""One run's Dask cluster and the hosts on it, from start to close.

:class:`RunCluster` is a context manager used by the driver. On entry it uses the
given client or starts a ``LocalCluster`` (127.0.0.1, one single-threaded worker
process per actor plus one for the buffer and learner); on exit it releases
every host and closes what it started, whatever happened in between. It composes the
parts that keep the hosts alive meanwhile: the :class:`~tianji_dask.runtime.cluster.supervisor.Supervisor`
(heartbeats, health), the :class:`~tianji_dask.runtime.cluster.recovery.Recovery` (re-creating lost
hosts) and the :class:`~tianji_dask.runtime.cluster.snapshot_keeper.SnapshotKeeper` (what a rebuilt group
continues from).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import psutil
from distributed import LocalCluster, Nanny
from distributed.deploy.spec import SpecCluster

from tianji_dask.channels import ChannelPlugin
from tianji_dask.config.deployment import deployment_settings
from tianji_dask.errors import HostLost, LearnerLost
from tianji_dask.runtime.cluster import dask_logs
from tianji_dask.runtime.cluster.host_builder import HostBuilder
from tianji_dask.runtime.cluster.host_stopping import stop_all
from tianji_dask.runtime.cluster.recovery import Recovery
from tianji_dask.runtime.cluster.restarts import Key, first_line
from tianji_dask.runtime.cluster.run_hosts import RunHosts, StartAbandoned
from tianji_dask.runtime.cluster.snapshot_keeper import SnapshotKeeper
from tianji_dask.runtime.cluster.supervisor import Supervisor
from tianji_dask.runtime.cluster.worker_deaths import death_reasons, watch_worker_deaths
from tianji_dask.runtime.hosts.hosts import stop_event_name
from tianji_dask.runtime.processes.client_context import current_client
from tianji_dask.runtime.processes.cuda_mps import PrivateMps, cuda_processes, mps_control
from tianji_dask.runtime.processes.fork_server import end_fork_server, start_fork_server, wait_for_fork_server
from tianji_dask.runtime.processes.forked_workers import ForkedNanny
from tianji_dask.runtime.processes.worker_signals import spawned_ignoring_driver_signals

if TYPE_CHECKING:
    from tianji_dask.config.schema import ExperimentConfig

CLUSTER_START_TRIES = 3  # a LocalCluster whose worker process died while it started is started again
FINAL_HEARTBEATS_S = 0.3  # how long the stopped hosts' last heartbeats (Dask log events) get to reach the client


class TianjiLocalCluster(LocalCluster):
    """A LocalCluster whose ``close()`` (and ``with`` exit) also ends any worker process still
    alive: its workers ignore SIGTERM, so one left running would also hang multiprocessing's exit
    handler; whose nannies are never closed for a worker that left; and which keeps Dask's INFO
    log quiet until the last of the process's clusters has closed (:mod:`~tianji_dask.runtime.cluster.dask_logs`)."""

    def __init__(self, *args, **kwargs):
        dask_logs.acquire()
        self._holds_logs = True
        try:
            super().__init__(*args, **kwargs)
        except BaseException:
            self._release_logs()
            raise

    def _release_logs(self) -> None:
        if getattr(self, "_holds_logs", False):
            self._holds_logs = False
            dask_logs.release()

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
            self._release_logs()


def local_cluster(
    n_workers: int,
    *,
    dashboard: bool = True,
    preload_roles: bool = True,
    security=None,
    worker_env: dict[str, str] | None = None,
) -> TianjiLocalCluster:
    """The LocalCluster of tianji-dask's runs, profiles and benchmarks: loopback only, one
    single-threaded worker process each, workers that leave SIGINT and SIGTERM to the driver.

    ``preload_roles``: the workers import torch and gymnasium as they start
    (``tianji_dask.runtime.processes.worker_preload``); the channel benchmark, which measures the transport alone,
    leaves them out. ``security`` (a ``distributed.Security``): scheduler, workers and nannies
    listen on tls:// only, with its certificates; the project's channels answer on the workers'
    own listeners, so they are TLS too. ``worker_env``: variables set in each worker process as
    it starts (a private CUDA MPS daemon's directories)."""
    from distributed.system import MEMORY_LIMIT

    # Dask's MALLOC_TRIM_THRESHOLD_ stays: it keeps the small-message processes' memory low, and
    # the channels raise glibc's thresholds themselves once large messages arrive
    # (channels/wire.py, the allocator; docs/benchmarks.md has both measurements).
    # Dask's default memory limit splits the machine evenly between workers, and its nanny kills
    # a worker past 95 % of its share. The roles are not even: one buffer may hold a replay of
    # most of the machine beside small actors, so each worker may use it all
    # (the run checks before it starts that the replay fits: checks.check_replay_fits).
    # The workers leave SIGINT and SIGTERM to the driver from their first instruction on
    # (tianji_dask.runtime.processes.worker_signals).
    # Their processes fork from a server that imported the roles (tianji_dask.runtime.processes.fork_server);
    # the channel benchmark's spawn without importing them.
    preload = [
        "tianji_dask.runtime.processes.worker_signals",
        *(["tianji_dask.runtime.processes.worker_preload"] if preload_roles else []),
    ]
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
            env=worker_env or {},
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
    """One run's cluster and hosts for the driver: a context manager (see the module docstring).
    Once the hosts are started (:meth:`start_hosts`), its ``supervisor`` watches them,
    ``recovery`` re-creates those of lost workers and ``snapshots`` keeps what their groups
    continue from."""

    supervisor: Supervisor  # from the entry on
    snapshots: SnapshotKeeper  # from start_hosts on
    recovery: Recovery  # from start_hosts on

    def __init__(
        self,
        cfg: ExperimentConfig,
        client,
        run_id: str,
        on_event=lambda text: None,
        *,
        hurry: threading.Event | None = None,
        stop: threading.Event | None = None,
        security=None,
    ):
        self.cfg = cfg
        # set: the run was asked to stop; a start under way is given up (StartAbandoned)
        self._stop = stop or threading.Event()
        self._security = security  # with no client: the own LocalCluster's TLS certificates
        self._hurry = hurry or threading.Event()  # set: stop without waiting for the hosts
        self.run_id = run_id
        self.client = client
        self._own_cluster: TianjiLocalCluster | None = None
        self._mps: PrivateMps | None = None
        self._on_event = on_event
        self.hosts: RunHosts | None = None
        self._final: list[dict] = []
        self._began = time.time()
        self._startup_grace_s = deployment_settings().timeouts.host_startup

    # --- the cluster ----------------------------------------------------------------------
    def __enter__(self) -> RunCluster:
        watch_worker_deaths()
        if self.client is None:
            from distributed import Client

            began = time.monotonic()
            self._start_mps()
            try:
                # the fork server's imports are the seconds of a LocalCluster's start: waited
                # for here, where a stop need not wait them out
                start_fork_server()
                if not wait_for_fork_server(give_up=self._stop):
                    end_fork_server()  # its imports would take the CPU the results are written with
                    raise StartAbandoned("the run was asked to stop before its LocalCluster started")
                if self._stop.is_set():
                    raise StartAbandoned("the run was asked to stop before its LocalCluster started")
                self._own_cluster = self._start_local_cluster()
            except BaseException:
                if self._mps is not None:
                    self._mps.stop()
                raise
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
        self.supervisor = Supervisor(self.client, self.cfg, self.run_id, self._on_event, since=self._began)
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.supervisor.unsubscribe()
            futures = self.hosts.futures() if self.hosts is not None else []
            if futures:
                self.client.cancel(futures)
                from distributed import Event

                # set: the hosts already made stop, and their watches of it end (one still
                # waiting as its worker closes has its wait cancelled by the scheduler, which
                # logs the CancelledError as an error); cleared only on a scheduler that
                # outlives the run, so that it keeps nothing of it
                stop = Event(stop_event_name(self.run_id), client=self.client)
                stop.set()
                if self._own_cluster is None:
                    stop.clear()
            self.hosts = None
        finally:
            self._current_client.__exit__(None, None, None)
            try:
                if self._own_cluster is not None:
                    self.client.close()
                    self._own_cluster.close()
            finally:
                if self._mps is not None:
                    self._mps.stop()

    def _own_workers(self) -> int:
        t = self.cfg.topology
        return t.groups * (t.actors + t.learners)

    def _start_mps(self) -> None:
        """A private CUDA MPS daemon for the LocalCluster's workers, where the deployment
        setting asks for one (:mod:`~tianji_dask.runtime.processes.cuda_mps`). Under ``auto`` a daemon that
        does not start leaves the workers to share the GPU by time slices."""
        setting = deployment_settings().local_cluster.cuda_mps
        control = mps_control(setting, self.cfg)
        if control is None:
            return
        try:
            self._mps = PrivateMps(control).start()
        except RuntimeError as exc:
            if setting == "on":
                raise HostLost(f"tianji.local-cluster.cuda-mps=on: {exc}") from None
            self._on_event(f"CUDA MPS did not start ({exc}); the GPU processes share the GPU by time slices")
            return
        n = cuda_processes(self.cfg)
        self._on_event(f"CUDA MPS: the run's {n} GPU processes share the GPU through a private daemon")

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
                return local_cluster(n, security=self._security, worker_env=self._mps.env if self._mps else None)
            except Exception as exc:  # noqa: BLE001 - Dask raises plain RuntimeErrors here
                why = f"{type(exc).__name__}: {first_line(exc)}{death_reasons(since, wait_s=0.5)}"
            if attempt == tries or self._hurry.is_set():
                raise HostLost(f"the run's LocalCluster of {n} workers did not start in {attempt} tries: {why}")
            self._on_event(
                f"the run's LocalCluster did not start ({why}); starting it again (try {attempt + 1} of {tries})"
            )
        raise AssertionError("unreachable")

    def _wait_for_own_workers(self) -> None:
        """The run's own LocalCluster with all its workers before the hosts are placed: one
        killed since it started comes back under its name (its nanny restarts it). One that does
        not come back within the start-up grace leaves its hosts to share the others."""
        n = self._own_workers()
        with contextlib.suppress(TimeoutError):
            self.client.wait_for_workers(n, timeout=self._startup_grace_s)

    # --- the hosts ------------------------------------------------------------------------
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
        then start their loops (:class:`~tianji_dask.runtime.cluster.host_builder.HostBuilder`);
        ``restore`` and ``prior`` continue a run (:meth:`HostBuilder.build_all`), a worker lost
        meanwhile is replaced (:meth:`Recovery.build_all`; ``totals`` and ``add_heartbeat`` as
        for :meth:`Recovery.recover`: hosts that had started carry their counts)."""
        if self._own_cluster is not None:
            self._wait_for_own_workers()
        hosts = RunHosts(self.client, self.cfg, self.run_id, self._on_event, self._hurry)
        self.hosts = self.supervisor.hosts = hosts
        self.snapshots = SnapshotKeeper(self.cfg, hosts, self._on_event)
        self.recovery = Recovery(
            self.cfg, HostBuilder(hosts, spaces), self.supervisor, self.snapshots, hurry=self._hurry
        )
        plan = hosts.place_all()
        if plan.workers_shared:
            t = self.cfg.topology
            n_hosts = t.groups * (t.learners + t.actors)
            self._on_event(
                f"{len(hosts.replacement.worker_names)} workers for {n_hosts} host processes: hosts will share workers"
            )
        self._on_event("hosts placed: " + _placed(plan.host_workers()))
        given = prior or (lambda key, counter: 0)
        began = time.monotonic()

        def carried(key: Key, counter: str) -> float:
            return given(key, counter) + totals(key[0], key[1], counter)

        hosts.abandon = self._stop
        try:
            self.recovery.build_all(restore, carried, add_heartbeat)
        finally:
            hosts.abandon = None
        expected = hosts.current_plan().host_workers()
        self.worker_addresses = sorted(set(expected.values()))
        self.supervisor.hosts_started(expected)
        self._on_event(f"{len(expected)} hosts created and started in {time.monotonic() - began:.1f} s")

    def stop_hosts(self) -> None:
        """Stop every loop; hosts that are gone are skipped. Keeps their last heartbeats
        (:meth:`final_heartbeats`); no heartbeat reaches the subscriber after it returns."""
        try:  # every loop sees the global stop at once; stop_all() below waits for each to finish
            from distributed import Event

            Event(stop_event_name(self.run_id), client=self.client).set()
        except Exception as exc:  # noqa: BLE001
            self._on_event(f"could not set the global stop event: {exc!r}")
        if self.hosts is not None:
            self._final.extend(stop_all(self.hosts))
        if not self._hurry.is_set():
            time.sleep(FINAL_HEARTBEATS_S)
        self.supervisor.unsubscribe()

    def final_heartbeats(self) -> list[dict]:
        return list(self._final)

    # --- the learner's state --------------------------------------------------------------
    @property
    def learner(self):
        """The handle of group 0's lead learner (the one the run's checkpoints save)."""
        return self._built().lead(0)

    def _built(self) -> RunHosts:
        if self.hosts is None:
            raise RuntimeError("the run's hosts were used before they were started")
        return self.hosts

    def learner_checkpoint(self, timeout: float) -> tuple[bytes, dict] | None:
        """The learner's final state, packed (:func:`~tianji_dask.results.checkpoint.pack_state`). A
        learner lost as the run stopped gives its newest snapshot instead, if there is one; with
        none, :class:`LearnerLost`."""
        try:
            return self.learner.checkpoint().result(timeout=timeout)
        except Exception as exc:
            why = f"{type(exc).__name__}: {first_line(exc)}"
            if 0 in self.snapshots.learners:
                self._on_event(f"final checkpoint: the learner did not answer ({why}); saving its newest snapshot")
                return self.snapshots.learners[0]
            lead = self._built().current_plan().learners[0].worker
            if self.supervisor.lost_while_building({("learner", 0): lead}):
                raise LearnerLost(
                    f"the learner's worker {lead} was lost as the run stopped ({why}) and no snapshot was taken"
                ) from None
            raise

    def learner_snapshot(self) -> tuple[bytes, dict]:
        """The learner's state while it trains (a periodic checkpoint), packed."""
        return self.learner.snapshot().result(timeout=90)
