"""One run's hosts on a Dask cluster: placement, wiring, heartbeats, health, shutdown.

:class:`RunCluster` is a context manager used by the driver. On entry it uses the
given client or starts a ``LocalCluster`` (127.0.0.1, one single-threaded worker
process per actor plus one for the buffer and learner); on exit it releases
every host and closes what it started, whatever happened in between.
"""

from __future__ import annotations

import math
import time


from tianji_dask.channels import ChannelPlugin
from tianji_dask.hosts import ActorHost, BufferHost, LearnerHost, metrics_topic, stop_event_name
from tianji_dask.seeding import role_seeds

STARTUP_GRACE_S = 60.0  # building envs and importing torch on a busy machine takes a while
STOP_TIMEOUT_S = 10.0


class HostLost(RuntimeError):
    """A host stopped sending heartbeats or reported an error; the message says which."""


def local_cluster(n_workers: int):
    """A LocalCluster for one run: loopback only, one thread per worker."""
    from distributed import LocalCluster

    # Dask's MALLOC_TRIM_THRESHOLD_ stays: it costs 20-40 % on receives of 512 KiB messages
    # (shared/notes/dask_mechanics.md), but CartPole chunks are 12 KB, and without it the
    # learner's process held 402 MB instead of 362 MB (the 400 MB per-host budget).
    return LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                        host="127.0.0.1", dashboard_address="127.0.0.1:0",
                        preload=["tianji_dask.worker_preload"])


class RunCluster:
    def __init__(self, cfg, client, run_id: str, on_event=lambda text: None):
        self.cfg = cfg
        self.run_id = run_id
        self.client = client
        self._own_cluster = None
        self._on_event = on_event
        self._futures: list = []
        self.buffer = self.learner = None
        self.actors: list = []
        self._expected: dict[tuple[str, int], str] = {}
        self._last_rx: dict[tuple[str, int], float] = {}
        self._errors: list[str] = []
        self._final: list[dict] = []
        self._subscribed = False
        self._started_at = time.time()

    # --- lifecycle ----------------------------------------------------------------------
    def __enter__(self) -> "RunCluster":
        if self.client is None:
            from distributed import Client

            self._own_cluster = local_cluster(self.cfg.topology.actors + 1)
            self.client = Client(self._own_cluster)
        self.dashboard_link = self.client.dashboard_link
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
            self.actors = []
        finally:
            if self._own_cluster is not None:
                self.client.close()
                self._own_cluster.close()

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
        timeout = self.cfg.run.heartbeat_timeout
        for key, where in self._expected.items():
            last = self._last_rx.get(key)
            if last is None:
                if now - self._started_at > STARTUP_GRACE_S:
                    raise HostLost(f"{key[0]} {key[1]} on {where}: no heartbeat within "
                                   f"{STARTUP_GRACE_S:.0f} s of starting")
            elif now - last > timeout:
                raise HostLost(f"{key[0]} {key[1]} on {where}: no heartbeat for {now - last:.1f} s "
                               f"(run.heartbeat_timeout={timeout} s): its worker process died or its loop is stuck")

    # --- hosts ----------------------------------------------------------------------------
    def _placement(self) -> tuple[str, list[str]]:
        workers = sorted(self.client.scheduler_info(n_workers=-1)["workers"])
        if not workers:
            raise RuntimeError("the cluster has no workers")
        n = self.cfg.topology.actors
        if len(workers) < n + 1:
            self._on_event(f"{len(workers)} workers for {n} actors + 1 learner: hosts will share workers")
        buffer_worker = workers[0]
        others = workers[1:] or workers
        return buffer_worker, [others[i % len(others)] for i in range(n)]

    def _submit(self, cls, *args, worker: str):
        fut = self.client.submit(cls, *args, actor=True, workers=[worker], allow_other_workers=False,
                                 pure=False)
        self._futures.append(fut)
        return fut

    def start_hosts(self, spaces) -> None:
        """Create and wire all hosts, then start their loops (buffer, learner, actors)."""
        cfg, rid = self.cfg, self.run_id
        cfg_json = cfg.to_json()
        n = cfg.topology.actors
        seeds = role_seeds(cfg.seed, n)
        buffer_worker, actor_workers = self._placement()
        obs = spaces.observation_space
        traj = f"traj-{rid}"
        params = [f"params-{rid}-{i}" for i in range(n)]
        # Inboxes must exist before anything is sent to them: the buffer's queue and the
        # actors' parameter inboxes are opened in their constructors, before the learner starts.
        # observations travel and are stored as float32 (the actors cast them)
        buffer_f = self._submit(BufferHost, rid, cfg_json, 0, seeds.buffer, traj, tuple(obs.shape),
                                "float32", worker=buffer_worker)
        actor_fs = [self._submit(ActorHost, rid, cfg_json, i, seeds.actors[i], buffer_worker, traj, params[i],
                                 worker=actor_workers[i]) for i in range(n)]
        self.buffer = buffer_f.result()
        self.actors = [f.result() for f in actor_fs]
        obs_dim = int(math.prod(obs.shape))
        learner_f = self._submit(LearnerHost, rid, cfg_json, 0, seeds.learner,
                                 [(actor_workers[i], params[i]) for i in range(n)], obs_dim,
                                 int(spaces.action_space.n), worker=buffer_worker)
        self.learner = learner_f.result()
        self._expected = {("buffer", 0): buffer_worker, ("learner", 0): buffer_worker}
        self._expected.update({("actor", i): actor_workers[i] for i in range(n)})
        self._started_at = time.time()
        for host in [self.buffer, self.learner, *self.actors]:
            host.start().result()

    def stop_hosts(self) -> None:
        """Stop every loop; hosts that are gone are skipped. Keeps their last heartbeats."""
        hosts = [h for h in [*self.actors, self.learner, self.buffer] if h is not None]
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
                hb = fut.result(timeout=max(0.1, deadline - time.monotonic()))
                if hb:
                    self._final.append({**hb, "episodes": []})  # episodes already came by heartbeat
            except Exception as exc:  # noqa: BLE001
                self._on_event(f"a host did not stop cleanly: {exc!r}")
        time.sleep(2 * 0.05 + 0.2)  # let the final log_event heartbeats reach the client

    def final_heartbeats(self) -> list[dict]:
        return list(self._final)

    def learner_checkpoint(self) -> tuple[dict, dict]:
        return self.learner.checkpoint().result(timeout=60)
