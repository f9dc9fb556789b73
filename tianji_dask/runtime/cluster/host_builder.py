"""Building the run's hosts where the placement puts them: created, wired, started; at the
start, and again after their worker was lost (:mod:`~tianji_dask.runtime.cluster.recovery`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeAlias

import numpy as np

from tianji_dask.envs import observation_dtype
from tianji_dask.runtime.cluster.restarts import Key
from tianji_dask.runtime.hosts.hosts import ActorHost, BufferHost, LearnerHost
from tianji_dask.seeding import incarnation_seed

if TYPE_CHECKING:
    from tianji_dask.roles.replay_state import ReplayState
    from tianji_dask.runtime.cluster.placement import ActorPlace, LearnerPlace, Placement
    from tianji_dask.runtime.cluster.run_hosts import RunHosts

Prior: TypeAlias = Callable[[Key, str], float]  # a host's counter before this incarnation
Replays: TypeAlias = "dict[int, ReplayState] | None"  # by buffer id, the replay a rebuilt buffer starts with


class HostBuilder:
    """Creates the hosts of :class:`~tianji_dask.runtime.cluster.run_hosts.RunHosts` for envs of
    ``spaces`` (the env's observation and action spaces) and starts their loops."""

    def __init__(self, hosts: RunHosts, spaces):
        self.hosts = hosts
        self._cfg_json = hosts.cfg.to_json()
        obs = spaces.observation_space
        self._obs_shape = tuple(obs.shape)
        self._obs_dtype = np.dtype(observation_dtype(hosts.cfg.env)).name  # as the actors store and send them
        self._obs_dim = int(math.prod(obs.shape))
        self._action_space = spaces.action_space

    def build_all(self, restore: bytes | None = None, prior: Prior | None = None) -> None:
        """Every group's hosts, then every loop started (a group's gossip peers must exist
        before any lead publishes to them). A continued run passes its learner state
        (``restore``, for every group) and what its hosts had counted (``prior``)."""
        hosts = self.hosts
        for group in range(hosts.cfg.topology.groups):
            self._build_group(group, restore=restore, prior=prior or (lambda key, counter: 0))
        for key in _start_order(list(hosts.handles)):
            hosts.wait(hosts.handles[key].start(), hosts.worker_of(key))

    def build_group_again(self, group: int, restore: bytes | None, prior: Prior, replays: Replays = None) -> None:
        """Second half of rebuilding a group (the first: :func:`host_stopping.stop_group`), once
        the stopped hosts' heartbeats are recorded (``prior`` reads them): create the group on the
        plan's (moved) workers (its buffers with ``replays``, by buffer id), point the other
        groups' gossip at its lead (where it moved, or where an earlier rebuild cut short left
        it), start it."""
        hosts = self.hosts
        self._build_group(group, restore, prior, replays)
        t, plan = hosts.cfg.topology, hosts.current_plan()
        lead_now = plan.learners[group * t.learners].worker
        for other in range(t.groups):
            spec = plan.learners[other * t.learners].gossip
            if other == group or spec is None:
                continue
            for address, channel in spec["publish_to"]:
                if address == lead_now:  # this group's inbox for the other group's snapshots
                    other_lead = plan.learners[other * t.learners].worker
                    hosts.wait(hosts.lead(other).move_subscriber(channel, lead_now), other_lead)
        for key in _start_order(hosts.group_keys(group)):
            hosts.wait(hosts.handles[key].start(), hosts.worker_of(key))

    def recreate_actor(self, actor_id: int, prior: Prior) -> None:
        """A lost actor, alone, on its (already moved) worker in the plan; its group's lead
        learner publishes to it there."""
        hosts = self.hosts
        key = ("actor", actor_id)
        ap = hosts.current_plan().actors[actor_id]
        hosts.release(key)
        hosts.incarnations[key] += 1
        handle = hosts.wait(self._submit_actor(ap, prior, with_group=False), ap.worker)
        hosts.handles[key] = handle
        lead = hosts.current_plan().learners[ap.group * hosts.cfg.topology.learners].worker
        hosts.wait(hosts.lead(ap.group).move_subscriber(ap.parameters, ap.worker), lead)
        hosts.wait(handle.start(), ap.worker)

    def _build_group(self, group: int, restore: bytes | None, prior: Prior, replays: Replays = None) -> None:
        """Create and wire the group's hosts (not started): buffers and actors first, then the
        learners, rank 0 first (it opens the rendezvous the others join). ``replays``: by buffer
        id, the replay a re-created buffer starts with (sent straight to its worker)."""
        hosts = self.hosts
        plan = hosts.current_plan()
        futures = {}
        scattered = []
        for lp in (p for p in plan.learners if p.group == group):
            replay = (replays or {}).get(lp.id)
            if replay is not None:  # to the worker directly, not inside the task
                replay = hosts.client.scatter(replay, workers=[lp.worker], direct=True, hash=False)
                scattered.append(replay)
            futures[("buffer", lp.id)] = self._submit_buffer(lp, replay)
        for ap in (p for p in plan.actors if p.group == group):
            futures[("actor", ap.id)] = self._submit_actor(ap, prior)
        try:
            for key, fut in futures.items():
                hosts.handles[key] = hosts.wait(fut, hosts.worker_of(key))
        finally:
            for data in scattered:  # restored into the buffer: the worker may drop its copy
                data.release()
        self._build_learners(plan, group, restore)

    def _submit_buffer(self, lp: LearnerPlace, replay):
        hosts = self.hosts
        key = ("buffer", lp.id)
        return hosts.submit(
            key,
            BufferHost,
            hosts.run_id,
            self._cfg_json,
            lp.id,
            incarnation_seed(lp.buffer_seed, hosts.incarnations[key]),
            lp.trajectories,
            self._obs_shape,
            self._obs_dtype,
            len(lp.feeders),
            incarnation=hosts.incarnations[key],
            replay=replay,
            worker=lp.worker,
        )

    def _build_learners(self, plan: Placement, group: int, restore: bytes | None) -> None:
        """The group's learners, one after the other, rank 0 first: the others are given the
        address of the rendezvous it opened."""
        hosts = self.hosts
        world_size = hosts.cfg.topology.learners
        store = None
        for lp in sorted((p for p in plan.learners if p.group == group), key=lambda p: p.rank):
            key = ("learner", lp.id)
            handle = hosts.submit(
                key,
                LearnerHost,
                hosts.run_id,
                self._cfg_json,
                lp.id,
                incarnation_seed(lp.learner_seed, hosts.incarnations[key]),
                list(lp.subscribers),
                self._obs_dim,
                self._action_space,
                hosts.handles[("buffer", lp.id)],
                rank=lp.rank,
                world_size=world_size,
                store_address=store,
                gossip_peers=lp.gossip,
                incarnation=hosts.incarnations[key],
                restore=restore,
                worker=lp.worker,
            )
            handle = hosts.wait(handle, lp.worker)
            if lp.rank == 0 and world_size > 1:
                store = hosts.wait(handle.rendezvous_address(), lp.worker)
            hosts.handles[key] = handle

    def _submit_actor(self, ap: ActorPlace, prior: Prior, *, with_group: bool = True):
        """``with_group``: built with its group's learners and buffers (at the start, or in a
        rebuild), so the balance controller starts from 0 on both sides."""
        hosts = self.hosts
        key = ("actor", ap.id)
        return hosts.submit(
            key,
            ActorHost,
            hosts.run_id,
            self._cfg_json,
            ap.id,
            incarnation_seed(ap.seed, hosts.incarnations[key]),
            ap.buffer_worker,
            ap.trajectories,
            ap.parameters,
            incarnation=hosts.incarnations[key],
            prior_env_steps=int(prior(key, "env_steps")),
            balance_from_zero=with_group,
            buffer_id=ap.buffer,
            worker=ap.worker,
        )


def _start_order(keys: list[Key]) -> list[Key]:
    """Buffers, then learners, then actors: each one's peers are there when its loop starts."""
    rank = {"buffer": 0, "learner": 1, "actor": 2}
    return sorted(keys, key=lambda k: (rank[k[0]], k[1]))
