"""Placement as a pure function (tianji_dask/runtime/cluster/placement.py) on fake worker lists: untagged and
tagged workers, fewer workers than hosts, several data-parallel learners and groups. No cluster."""

from __future__ import annotations

import random

import pytest

from tianji_dask.config import load_config
from tianji_dask.config.schema import TopologyConfig
from tianji_dask.devices import device_of_slot, on_slot_gpu
from tianji_dask.runtime.cluster.placement import PlacementError, place
from tianji_dask.seeding import group_seeds, role_seeds

RUN = "r1"


def untagged(n: int) -> dict[str, dict]:
    addresses = [f"tcp://10.0.0.{k}:4000" for k in range(1, n + 1)]
    random.Random(n).shuffle(addresses)  # the scheduler's order is not the placement's
    return {a: {"name": a, "resources": {}} for a in addresses}


def tagged(groups: int, learners: int, actors: int, extra_untagged: int = 0) -> dict[str, dict]:
    """As tianji_dask.deploy.slurm starts them: named workers with role and group resources; the
    addresses sort in another order than the names."""
    out = {}
    k = 99
    for g in range(groups):
        for role, n in (("learner", learners), ("actor", actors)):
            for j in range(n):
                out[f"tcp://10.1.0.{k}:4000"] = {
                    "name": f"g{g}-{role}-{j}",
                    "resources": {f"tianji_{role}": 1, f"tianji_group_{g}": 1},
                }
                k -= 1
    for e in range(extra_untagged):
        out[f"tcp://10.2.0.{e}:4000"] = {"name": f"other-{e}", "resources": {}}
    items = list(out.items())
    random.Random(0).shuffle(items)
    return dict(items)


def test_one_group_on_enough_untagged_workers_learner_first_in_address_order():
    workers = untagged(3)
    p = place(workers, TopologyConfig(actors=2), RUN, root_seed=7)
    first, second, third = sorted(workers)
    assert [lp.worker for lp in p.learners] == [first]
    assert [ap.worker for ap in p.actors] == [second, third]
    assert not p.workers_shared
    (lp,) = p.learners
    seeds = role_seeds(7, 2)  # group 0 uses the serial reference's seeds
    assert (lp.id, lp.group, lp.rank, lp.learner_seed, lp.buffer_seed) == (0, 0, 0, seeds.learner, seeds.buffer)
    assert lp.trajectories == "traj-r1-0" and lp.feeders == (0, 1) and lp.gossip is None
    assert lp.subscribers == ((second, "params-r1-0"), (third, "params-r1-1"))
    assert [(ap.id, ap.seed, ap.buffer, ap.buffer_worker, ap.trajectories, ap.parameters) for ap in p.actors] == [
        (0, seeds.actors[0], 0, first, "traj-r1-0", "params-r1-0"),
        (1, seeds.actors[1], 0, first, "traj-r1-0", "params-r1-1"),
    ]
    assert p.host_workers() == {("buffer", 0): first, ("learner", 0): first, ("actor", 0): second, ("actor", 1): third}


def test_fewer_workers_than_hosts_are_shared_round_robin():
    workers = untagged(2)
    p = place(workers, TopologyConfig(actors=3), RUN, root_seed=0)
    w0, w1 = sorted(workers)
    assert p.workers_shared
    assert [lp.worker for lp in p.learners] == [w0]
    assert [ap.worker for ap in p.actors] == [w1, w0, w1]


def test_groups_of_data_parallel_learners_split_their_actors_and_gossip_between_leads():
    topo = TopologyConfig(groups=2, learners=2, actors=3)
    workers = untagged(10)
    p = place(workers, topo, RUN, root_seed=3)
    order = sorted(workers)
    # per group: its 2 learners, then its 3 actors
    assert [lp.worker for lp in p.learners] == [order[0], order[1], order[5], order[6]]
    assert [ap.worker for ap in p.actors] == [order[2], order[3], order[4], order[7], order[8], order[9]]
    assert [(lp.id, lp.group, lp.rank) for lp in p.learners] == [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
    # actor i of a group feeds buffer i % learners of the same group
    assert [lp.feeders for lp in p.learners] == [(0, 2), (1,), (3, 5), (4,)]
    assert [ap.buffer for ap in p.actors] == [0, 1, 0, 2, 3, 2]
    assert all(ap.buffer_worker == p.learners[ap.buffer].worker for ap in p.actors)
    # the ranks of a group start from identical parameters; buffers and groups differ
    s0, s1 = group_seeds(3, 0, 3), group_seeds(3, 1, 3)
    assert [lp.learner_seed for lp in p.learners] == [s0.learner, s0.learner, s1.learner, s1.learner]
    assert [lp.buffer_seed for lp in p.learners] == [s0.buffer, s0.buffer + 1, s1.buffer, s1.buffer + 1]
    assert [ap.seed for ap in p.actors] == [*s0.actors, *s1.actors]
    assert len({ap.parameters for ap in p.actors}) == 6 and len({lp.trajectories for lp in p.learners}) == 4
    # each group's learners publish to that group's actors only
    assert p.learners[2].subscribers == tuple((ap.worker, ap.parameters) for ap in p.actors[3:])
    # only each group's rank 0 gossips, with the other group's rank 0
    assert p.learners[1].gossip is None and p.learners[3].gossip is None
    assert p.learners[0].gossip == {
        "group": 0,
        "inboxes": {1: "gossip-r1-0-from-1"},
        "publish_to": [(order[5], "gossip-r1-1-from-0")],
    }
    assert p.learners[2].gossip == {
        "group": 1,
        "inboxes": {0: "gossip-r1-1-from-0"},
        "publish_to": [(order[0], "gossip-r1-0-from-1")],
    }


def test_tagged_workers_take_exactly_the_hosts_they_were_sized_for_in_name_order():
    topo = TopologyConfig(groups=2, learners=1, actors=2)
    workers = tagged(2, 1, 2, extra_untagged=2)
    p = place(workers, topo, RUN, root_seed=0)
    name = {a: w["name"] for a, w in workers.items()}
    assert [name[lp.worker] for lp in p.learners] == ["g0-learner-0", "g1-learner-0"]
    assert [name[ap.worker] for ap in p.actors] == ["g0-actor-0", "g0-actor-1", "g1-actor-0", "g1-actor-1"]
    assert not p.workers_shared


def test_a_cluster_tagged_for_another_plan_is_refused_by_group():
    with pytest.raises(PlacementError, match=r"group 0 needs 1 learner and 3 actor workers, the cluster has 1 and 2"):
        place(tagged(2, 1, 2), TopologyConfig(groups=2, actors=3), RUN, root_seed=0)
    with pytest.raises(PlacementError, match=r"group 1 needs 1 learner and 2 actor workers, the cluster has 0 and 0"):
        place(tagged(1, 1, 2), TopologyConfig(groups=2, actors=2), RUN, root_seed=0)


def test_no_workers_is_refused():
    with pytest.raises(PlacementError, match="the cluster has no workers"):
        place({}, TopologyConfig(), RUN, root_seed=0)


def test_placement_is_a_function_of_its_inputs():
    topo = TopologyConfig(groups=2, learners=2, actors=2)
    workers = untagged(8)
    shuffled = dict(reversed(list(workers.items())))
    assert place(workers, topo, RUN, 5) == place(shuffled, topo, RUN, 5)
    assert place(workers, topo, RUN, 5) != place(workers, topo, RUN, 6)


def test_on_a_worker_with_several_gpus_each_learner_takes_its_own_and_its_actors_share_it():
    # 2 groups x 2 data-parallel learners on 4 GPUs: learner (and buffer) g*L + j on GPU g*L + j;
    # actor i of group g feeds buffer g*L + i % L and runs its inference on that learner's GPU
    p = place(untagged(12), TopologyConfig(groups=2, learners=2, actors=4), RUN, root_seed=0)
    assert [device_of_slot("cuda", lp.id, 4) for lp in p.learners] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert [device_of_slot("cuda", ap.buffer, 4) for ap in p.actors] == [
        *("cuda:0", "cuda:1", "cuda:0", "cuda:1"),
        *("cuda:2", "cuda:3", "cuda:2", "cuda:3"),
    ]
    # more learners than GPUs wrap around; one GPU (or a Slurm job's one) is everyone's
    assert [device_of_slot("cuda", s, 3) for s in range(5)] == ["cuda:0", "cuda:1", "cuda:2", "cuda:0", "cuda:1"]
    assert {device_of_slot("cuda", s, n) for s in range(5) for n in (0, 1)} == {"cuda"}
    # an explicit index and the CPU stay as the config says
    assert device_of_slot("cuda:2", 1, 4) == "cuda:2" and device_of_slot("cpu", 3, 4) == "cpu"


def test_a_cpu_config_is_left_as_it_is():
    cfg = load_config("configs/cartpole_dqn.yaml", check_env=False)
    assert on_slot_gpu(cfg, 3) is cfg
