"""The hosts of one run on its cluster: built where the placement puts them, wired, started,
re-created after their worker was lost, and stopped.

Every host is known by its key (role, global id) and its *incarnation*: 0 for the host the
run started with, k for its k-th re-creation. Re-creating follows what was lost:

- an **actor** alone: a new actor host on the replacement worker, with a new seed and its
  predecessors' env steps (its exploration schedule and its share of production go on); its
  group's lead learner moves the parameter subscriber there and sends the latest version;
- a **buffer or learner** (they share a worker): the whole group is rebuilt, its surviving hosts
  stopped first: buffers, actors and learners on the plan's workers (the lost one replaced), the
  learners restored from the group's newest state in the driver's memory, each buffer with the
  replay kept there beside it (up to ``run.replay_snapshot_mb``; without one it starts empty),
  data-parallel ranks with a new rendezvous, the other groups' gossip moved to the new lead.
"""

from __future__ import annotations

import collections
import contextlib
import math
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tianji_dask.config.deployment import deployment_settings
from tianji_dask.runtime.client_context import current_client
from tianji_dask.runtime.hosts import ActorHost, BufferHost, LearnerHost
from tianji_dask.runtime.placement import Placement, moved, place
from tianji_dask.runtime.restarts import HostLost, Key
from tianji_dask.runtime.workers import scheduler_workers
from tianji_dask.seeding import incarnation_seed

if TYPE_CHECKING:
    from tianji_dask.config.schema import ExperimentConfig
    from tianji_dask.roles.replay_state import ReplayState

STOP_TIMEOUT_S = 10.0
HURRY_POLL_S = 0.2  # how soon a host stop being waited for notices the run was told to hurry
REBUILD_STOP_S = 3.0  # how long a group being rebuilt waits for each surviving host to stop
WAIT_POLL_S = 0.5  # how often a wait for a host asks whether its worker is still there
DONE_POLL_S = 0.005  # how often it looks whether the host answered
TAKEOVER_WAIT_S = 15.0  # how long a lost worker's hosts wait for its replacement before sharing another


class RunHosts:
    """Handles of the run's hosts by key, and the placement they follow."""

    def __init__(
        self,
        client,
        cfg: ExperimentConfig,
        run_id: str,
        spaces,
        on_event: Callable[[str], None],
        hurry: threading.Event,
    ):
        self.client = client
        self.cfg = cfg
        self.run_id = run_id
        self._cfg_json = cfg.to_json()
        obs = spaces.observation_space
        self._obs_shape = tuple(obs.shape)
        self._obs_dim = int(math.prod(obs.shape))
        self._action_space = spaces.action_space
        self._on_event = on_event
        self._hurry = hurry
        self.handles: dict[Key, Any] = {}
        self._futures: dict[Key, Any] = {}
        self.incarnations: dict[Key, int] = defaultdict(int)
        self.plan: Placement | None = None
        self.worker_names: dict[str, str] = {}
        self.worker_resources: dict[str, dict] = {}
        self._startup_s = deployment_settings().timeouts.host_startup
        # a cluster that submits its ended batch jobs again (slurm_cluster.PlannedSLURMCluster)
        self._replace_jobs = getattr(getattr(client, "cluster", None), "replace_ended_jobs", None)

    # --- views ------------------------------------------------------------------------
    def current_plan(self) -> Placement:
        if self.plan is None:
            raise RuntimeError("the run's hosts were used before they were placed")
        return self.plan

    def of_role(self, role: str) -> list:
        return [h for (r, _), h in sorted(self.handles.items()) if r == role]

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

    def futures(self) -> list:
        return list(self._futures.values())

    # --- building -----------------------------------------------------------------------
    def _submit(self, key: Key, cls, *args, worker: str, **kwargs):
        fut = self.client.submit(
            cls, *args, **kwargs, actor=True, workers=[worker], allow_other_workers=False, pure=False
        )
        self._futures[key] = fut
        return fut

    def place_all(self) -> Placement:
        workers = scheduler_workers(self.client)
        self.worker_names = {a: str(info.get("name", a)) for a, info in workers.items()}
        self.worker_resources = {a: dict(info.get("resources") or {}) for a, info in workers.items()}
        self.plan = place(workers, self.cfg.topology, self.run_id, self.cfg.seed)
        return self.plan

    def build_all(self, restore: bytes | None = None, prior: Callable[[Key, str], float] | None = None) -> None:
        """Every group's hosts, then every loop started (a group's gossip peers must exist
        before any lead publishes to them). A continued run passes its learner state
        (``restore``, for every group) and what its hosts had counted (``prior``)."""
        for group in range(self.cfg.topology.groups):
            self._build_group(group, restore=restore, prior=prior or (lambda key, counter: 0))
        for key in self._start_order(list(self.handles)):
            self._wait(self.handles[key].start(), self._worker_of(key))

    @staticmethod
    def _start_order(keys: list[Key]) -> list[Key]:
        rank = {"buffer": 0, "learner": 1, "actor": 2}
        return sorted(keys, key=lambda k: (rank[k[0]], k[1]))

    def _build_group(
        self,
        group: int,
        restore: bytes | None,
        prior: Callable[[Key, str], float],
        replays: dict[int, ReplayState] | None = None,
    ) -> None:
        """Create and wire the group's hosts (not started): buffers and actors first, then the
        learners, rank 0 first (it opens the rendezvous the others join). ``replays``: by buffer
        id, the replay a re-created buffer starts with (sent straight to its worker)."""
        plan, rid, cfg_json, t = self.current_plan(), self.run_id, self._cfg_json, self.cfg.topology
        futures = {}
        scattered = []
        for lp in (p for p in plan.learners if p.group == group):
            key = ("buffer", lp.id)
            replay = (replays or {}).get(lp.id)
            if replay is not None:  # to the worker directly, not inside the task
                replay = self.client.scatter(replay, workers=[lp.worker], direct=True, hash=False)
                scattered.append(replay)
            futures[key] = self._submit(
                key,
                BufferHost,
                rid,
                cfg_json,
                lp.id,
                incarnation_seed(lp.buffer_seed, self.incarnations[key]),
                lp.trajectories,
                self._obs_shape,
                "float32",
                len(lp.feeders),
                incarnation=self.incarnations[key],
                replay=replay,
                worker=lp.worker,
            )
        for ap in (p for p in plan.actors if p.group == group):
            key = ("actor", ap.id)
            futures[key] = self._submit_actor(ap, prior)
        try:
            for key, fut in futures.items():
                self.handles[key] = self._wait(fut, self._worker_of(key))
        finally:
            for data in scattered:  # restored into the buffer: the worker may drop its copy
                data.release()
        store = None
        for lp in sorted((p for p in plan.learners if p.group == group), key=lambda p: p.rank):
            key = ("learner", lp.id)
            handle = self._submit(
                key,
                LearnerHost,
                rid,
                cfg_json,
                lp.id,
                incarnation_seed(lp.learner_seed, self.incarnations[key]),
                list(lp.subscribers),
                self._obs_dim,
                self._action_space,
                self.handles[("buffer", lp.id)],
                rank=lp.rank,
                world_size=t.learners,
                store_address=store,
                gossip_peers=lp.gossip,
                incarnation=self.incarnations[key],
                restore=restore,
                worker=lp.worker,
            )
            handle = self._wait(handle, lp.worker)
            if lp.rank == 0 and t.learners > 1:
                store = self._wait(handle.rendezvous_address(), lp.worker)
            self.handles[key] = handle

    def _submit_actor(self, ap, prior: Callable[[Key, str], float], *, with_group: bool = True):
        """``with_group``: built with its group's learners and buffers (at the start, or in a
        rebuild), so the balance controller starts from 0 on both sides."""
        key = ("actor", ap.id)
        return self._submit(
            key,
            ActorHost,
            self.run_id,
            self._cfg_json,
            ap.id,
            incarnation_seed(ap.seed, self.incarnations[key]),
            ap.buffer_worker,
            ap.trajectories,
            ap.parameters,
            incarnation=self.incarnations[key],
            prior_env_steps=int(prior(key, "env_steps")),
            balance_from_zero=with_group,
            buffer_id=ap.buffer,
            worker=ap.worker,
        )

    def _worker_of(self, key: Key) -> str:
        return self.current_plan().host_workers()[key]

    def _wait(self, fut, worker: str):
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
        # Client of the process, which may be another the user made (tianji_dask.runtime.client_context).
        with current_client(self.client):
            return fut.result()

    # --- re-creating --------------------------------------------------------------------
    def replacement(self, lost: str, timeout: float) -> str:
        """The worker that takes over a lost worker's hosts: the one of the same name (a
        LocalCluster's nanny restarts a killed process under its name, with a new address), or
        one with the same planner tags (a replacement batch job). If none comes within
        ``TAKEOVER_WAIT_S`` (a nanny does not restart a process killed while it starts, a
        cancelled job may not be replaced), the live worker holding the fewest of the run's
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
                load = collections.Counter(self.current_plan().host_workers().values())
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
            time.sleep(0.1)

    def move(self, lost: str, new: str) -> None:
        self.plan = moved(self.current_plan(), lost, new)

    def recreate_actor(self, actor_id: int, prior: Callable[[Key, str], float]) -> None:
        """A lost actor, alone, on its (already moved) worker in the plan; its group's lead
        learner publishes to it there."""
        key = ("actor", actor_id)
        ap = self.current_plan().actors[actor_id]
        self._release(key)
        self.incarnations[key] += 1
        handle = self._wait(self._submit_actor(ap, prior, with_group=False), ap.worker)
        self.handles[key] = handle
        lead = self.current_plan().learners[ap.group * self.cfg.topology.learners].worker
        self._wait(self.lead(ap.group).move_subscriber(ap.parameters, ap.worker), lead)
        self._wait(handle.start(), ap.worker)

    def stop_group(self, group: int) -> list[dict]:
        """First half of rebuilding a group: stop its surviving hosts and release them all.
        Returns the stopped hosts' last heartbeats (their episodes already came)."""
        keys = self.group_keys(group)
        pending = []
        for key in keys:
            with contextlib.suppress(Exception):  # a lost worker's host cannot be reached
                pending.append(self.handles[key].stop(REBUILD_STOP_S))
        final = []
        for fut in pending:
            try:
                hb = fut.result(timeout=REBUILD_STOP_S + 2)
                if hb:
                    final.append({**hb, "episodes": []})
            except Exception:  # noqa: BLE001 - gone with its worker, or stuck on it
                pass
        for key in keys:
            self._release(key)
            self.incarnations[key] += 1
        return final

    def build_group_again(
        self,
        group: int,
        restore: bytes | None,
        prior: Callable[[Key, str], float],
        replays: dict[int, ReplayState] | None = None,
    ) -> None:
        """Second half, once the stopped hosts' heartbeats are recorded (``prior`` reads them):
        create the group on the plan's (moved) workers (its buffers with ``replays``, by buffer
        id), point the other groups' gossip at its lead (where it moved, or where an earlier
        rebuild cut short left it), start it."""
        self._build_group(group, restore, prior, replays)
        t, plan = self.cfg.topology, self.current_plan()
        lead_now = plan.learners[group * t.learners].worker
        for other in range(t.groups):
            spec = plan.learners[other * t.learners].gossip
            if other == group or spec is None:
                continue
            for address, channel in spec["publish_to"]:
                if address == lead_now:  # this group's inbox for the other group's snapshots
                    other_lead = plan.learners[other * t.learners].worker
                    self._wait(self.lead(other).move_subscriber(channel, lead_now), other_lead)
        for key in self._start_order(self.group_keys(group)):
            self._wait(self.handles[key].start(), self._worker_of(key))

    def _release(self, key: Key) -> None:
        fut = self._futures.pop(key, None)
        self.handles.pop(key, None)
        if fut is not None:
            with contextlib.suppress(Exception):  # the scheduler may have forgotten it with its worker
                self.client.cancel([fut])

    # --- stopping -----------------------------------------------------------------------
    def stop_all(self) -> list[dict]:
        """Ask every host to stop and wait for each (unless hurried); their last heartbeats."""
        pending = []
        for key in sorted(self.handles, key=lambda k: ({"actor": 0, "learner": 1, "buffer": 2}[k[0]], k[1])):
            try:
                pending.append(self.handles[key].stop(STOP_TIMEOUT_S))
            except Exception as exc:  # noqa: BLE001 - a lost worker's host cannot be reached
                self._on_event(f"could not stop a host: {exc!r}")
        deadline = time.monotonic() + STOP_TIMEOUT_S + 2
        final = []
        for fut in pending:
            try:
                hb = self._result_unless_hurried(fut, deadline)
                if hb:
                    final.append({**hb, "episodes": []})  # episodes already came by heartbeat
            except Exception as exc:  # noqa: BLE001
                self._on_event(f"a host did not stop cleanly: {exc!r}")
        return final

    def _result_unless_hurried(self, fut, deadline: float):
        """``fut.result()`` until ``deadline``; None at once when the run is told to hurry."""
        while not self._hurry.is_set():
            try:
                return fut.result(timeout=max(0.01, min(HURRY_POLL_S, deadline - time.monotonic())))
            except TimeoutError:
                if time.monotonic() >= deadline:
                    raise
        return None
