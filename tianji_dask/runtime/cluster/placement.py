"""Where each host of a run goes, and how the hosts are wired: a pure function of the cluster's
workers, the topology, the run id and the root seed.

Per group g of ``topology.groups``: learners j = 0..L-1, each on its own worker with its buffer
(global id ``g*L + j``), and actors i = 0..A-1 (global id ``g*A + i``), actor i feeding buffer
``i % L`` of its group. Workers tagged with the planner's resources (``tianji_learner`` /
``tianji_actor`` and ``tianji_group_<g>``, as :mod:`tianji_dask.deploy.slurm` starts them) take exactly
the hosts they were sized for, in the order of their names (a worker tagged with both roles, of
a job holding a whole group, takes a learner first); untagged workers are used in address
order, learners first in each group, and shared round-robin when there are fewer than hosts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from tianji_dask.seeding import group_seeds


@dataclass(frozen=True)
class LearnerPlace:
    """One learner and its buffer, on one worker."""

    id: int  # global id g*L + j, shared by the learner and its buffer
    group: int
    rank: int  # j: the data-parallel rank within the group
    worker: str
    learner_seed: int  # the group's: data-parallel ranks start from identical parameters
    buffer_seed: int
    trajectories: str  # the buffer's queue channel
    feeders: tuple[int, ...]  # global ids of the actors that feed this buffer
    subscribers: tuple[tuple[str, str], ...]  # (worker, parameter channel) of each actor of the group
    gossip: dict | None  # rank 0 of each group when groups > 1: its inboxes and peers


@dataclass(frozen=True)
class ActorPlace:
    id: int  # global id g*A + i
    group: int
    worker: str
    seed: int
    buffer: int  # global id of the buffer it feeds
    buffer_worker: str
    trajectories: str  # that buffer's queue channel
    parameters: str  # this actor's parameter (topic) channel


@dataclass(frozen=True)
class Placement:
    learners: tuple[LearnerPlace, ...]  # by global id
    actors: tuple[ActorPlace, ...]  # by global id
    workers_shared: bool  # fewer (untagged) workers than host processes

    def host_workers(self) -> dict[tuple[str, int], str]:
        """(role, global id) -> worker of every host: buffers, learners and actors."""
        out = {("buffer", p.id): p.worker for p in self.learners}
        out.update({("learner", p.id): p.worker for p in self.learners})
        out.update({("actor", p.id): p.worker for p in self.actors})
        return out


def moved(plan: Placement, old: str, new: str) -> Placement:
    """``plan`` with every host and every address of worker ``old`` on worker ``new`` (a lost
    worker's hosts re-created on its replacement): placement and wiring, nothing else."""

    def at(address: str) -> str:
        return new if address == old else address

    def gossip(spec: dict | None) -> dict | None:
        if spec is None:
            return None
        return {**spec, "publish_to": [(at(a), ch) for a, ch in spec["publish_to"]]}

    learners = tuple(
        replace(
            p,
            worker=at(p.worker),
            subscribers=tuple((at(a), ch) for a, ch in p.subscribers),
            gossip=gossip(p.gossip),
        )
        for p in plan.learners
    )
    actors = tuple(replace(p, worker=at(p.worker), buffer_worker=at(p.buffer_worker)) for p in plan.actors)
    return Placement(learners, actors, plan.workers_shared)


class PlacementError(RuntimeError):
    """The cluster's workers cannot hold the run's hosts; the message says why."""


def place(workers: Mapping[str, Mapping], topology, run_id: str, root_seed: int) -> Placement:
    """``workers``: the scheduler's workers, address -> info (``resources``, ``name``)."""
    G, L, A = topology.groups, topology.learners, topology.actors
    learner_w, actor_w, shared = _workers_of_hosts(workers, G, L, A)
    traj = {b: f"traj-{run_id}-{b}" for b in learner_w}
    params = {a: f"params-{run_id}-{a}" for a in actor_w}
    learners, actors = [], []
    for g in range(G):
        seeds = group_seeds(root_seed, g, A)
        subscribers = tuple((actor_w[g * A + i], params[g * A + i]) for i in range(A))
        for j in range(L):
            b = g * L + j
            learners.append(
                LearnerPlace(
                    id=b,
                    group=g,
                    rank=j,
                    worker=learner_w[b],
                    learner_seed=seeds.learner,
                    buffer_seed=seeds.buffer + j,
                    trajectories=traj[b],
                    feeders=tuple(g * A + i for i in range(A) if i % L == j),
                    subscribers=subscribers,
                    gossip=_gossip(run_id, g, G, L, learner_w) if j == 0 and G > 1 else None,
                )
            )
        for i in range(A):
            a, b = g * A + i, g * L + i % L
            actors.append(
                ActorPlace(
                    id=a,
                    group=g,
                    worker=actor_w[a],
                    seed=seeds.actors[i],
                    buffer=b,
                    buffer_worker=learner_w[b],
                    trajectories=traj[b],
                    parameters=params[a],
                )
            )
    return Placement(tuple(learners), tuple(actors), shared)


def _gossip(run_id: str, g: int, G: int, L: int, learner_w: dict[int, str]) -> dict:
    """Group g's lead learner: an inbox per other group, and where to publish to each."""
    lead = {h: learner_w[h * L] for h in range(G)}
    return {
        "group": g,
        "inboxes": {h: f"gossip-{run_id}-{g}-from-{h}" for h in range(G) if h != g},
        "publish_to": [(lead[h], f"gossip-{run_id}-{h}-from-{g}") for h in range(G) if h != g],
    }


def _workers_of_hosts(
    workers: Mapping[str, Mapping], G: int, L: int, A: int
) -> tuple[dict[int, str], dict[int, str], bool]:
    """Worker of each learner (with its buffer) and of each actor, by global id."""
    if not workers:
        raise PlacementError("the cluster has no workers")
    tagged = {
        address: dict(info.get("resources") or {})
        for address, info in workers.items()
        if any(k.startswith("tianji_") for k in (info.get("resources") or {}))
    }
    learner_w: dict[int, str] = {}
    actor_w: dict[int, str] = {}
    if not tagged:
        needed = G * (L + A)
        ordered = sorted(workers)
        slots = iter([ordered[k % len(ordered)] for k in range(needed)])
        for g in range(G):
            for j in range(L):
                learner_w[g * L + j] = next(slots)
            for i in range(A):
                actor_w[g * A + i] = next(slots)
        return learner_w, actor_w, len(ordered) < needed
    for g in range(G):

        def having(role: str, g: int = g) -> list[str]:
            return sorted(
                (a for a, r in tagged.items() if role in r and f"tianji_group_{g}" in r),
                key=lambda a: workers[a].get("name", a),
            )

        learners = having("tianji_learner")[:L]
        # a group job's workers carry both roles: the learner's is not an actor's too
        actors = [a for a in having("tianji_actor") if a not in learners]
        if len(learners) < L or len(actors) < A:
            raise PlacementError(
                f"group {g} needs {L} learner and {A} actor workers, the cluster has "
                f"{len(learners)} and {len(actors)} tagged for it: the cluster was "
                "started for another plan"
            )
        learner_w.update({g * L + j: learners[j] for j in range(L)})
        actor_w.update({g * A + i: actors[i] for i in range(A)})
    return learner_w, actor_w, False
