"""The parts of a learner host's loop: snapshot hand-off, gossip, and updates
alone or as a data-parallel rank (a real gloo group of one here; two ranks in test_dataparallel)."""

import asyncio
import threading

import numpy as np
import pytest
import torch

from tianji_dask.channels import LocalTopic, TopicPublisher
from tianji_dask.runtime.hosts.dataparallel import DataParallel, DataParallelUpdates, Rendezvous, open_store
from tianji_dask.runtime.hosts.gossip import GossipSync, GroupGossip
from tianji_dask.runtime.hosts.hosts import LocalUpdates, SnapshotRequests


class ToyLearner:
    """A learner role's public surface, recording what the sync parts ask of it."""

    def __init__(self, can_update=True):
        self.can_update = can_update
        self.net = torch.nn.Linear(2, 1)
        self.updates = 0
        self.loaded = []
        self.gossip = []

    @property
    def module(self):
        return self.net

    def step(self):
        return self.wants_update() and self.update()

    def wants_update(self):
        return self.can_update

    def update(self):
        self.updates += 1
        return True

    def policy_params(self):
        return {"w": np.zeros(2, np.float32)}

    def load_policy_params(self, params):
        self.loaded.append(params)

    def record_gossip(self, rounds, distance):
        self.gossip.append((rounds, distance))


def test_snapshot_request_is_answered_by_the_loop_between_steps():
    snaps = SnapshotRequests()
    snaps.serve(lambda: pytest.fail("no request is pending: nothing may be taken"))
    want = snaps.request()
    assert not want.done()
    loop = threading.Thread(target=snaps.serve, args=(lambda: {"state": 1},))
    loop.start()
    loop.join()
    assert want.result(timeout=1) == {"state": 1}
    snaps.serve(lambda: pytest.fail("answered requests are not answered twice"))


def test_snapshot_failure_and_loop_end_reach_the_caller():
    snaps = SnapshotRequests()
    want = snaps.request()
    snaps.serve(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        want.result(timeout=1)
    want = snaps.request()
    snaps.cancel("learner 3's loop ended")
    with pytest.raises(RuntimeError, match="learner 3's loop ended"):
        want.result(timeout=1)
    snaps.cancel("nothing pending: a no-op")


def test_local_updates_update_when_they_can_and_stop_when_asked():
    learner, updates = ToyLearner(), LocalUpdates()
    assert updates.running(stop_requested=False)
    assert updates.step(learner, stop_requested=False, params_changed=False)
    assert learner.updates == 1
    idle = ToyLearner(can_update=False)
    assert not updates.step(idle, stop_requested=False, params_changed=False)
    assert idle.updates == 0
    assert not updates.running(stop_requested=True)


def test_gossip_sync_loads_the_average_only_when_peers_answered():
    clock = [0.0]
    topic = LocalTopic()

    class Publisher:
        def publish(self, version, payload):
            pass

    learner = ToyLearner()
    sync = GossipSync(GroupGossip(0, Publisher(), {1: topic.subscribe()}, 1.0, clock=lambda: clock[0]))
    assert not sync.apply(learner) and learner.gossip == []  # not due yet
    clock[0] = 1.0
    assert not sync.apply(learner)  # due, but no peer has published: nothing loaded
    assert learner.loaded == [] and learner.gossip[-1][0] == 1
    topic.publish(1, {"params": {"w": np.full(2, 4.0, np.float32)}, "group": np.array(1)})
    clock[0] = 2.0
    assert sync.apply(learner)
    np.testing.assert_array_equal(learner.loaded[-1]["w"], np.full(2, 2.0, np.float32))
    assert learner.gossip[-1] == (2, pytest.approx(np.sqrt(32.0)))


@pytest.fixture
def group_of_one():
    store = open_store("127.0.0.1", 1, 10)
    dp = DataParallel(0, 1, "127.0.0.1", store.port, timeout_s=10, store=store)
    yield dp
    dp.close()


def test_data_parallel_updates_agree_broadcast_and_stop_together(group_of_one):
    updates = DataParallelUpdates(group_of_one)
    learner = ToyLearner()
    assert updates.step(learner, stop_requested=False, params_changed=True)  # rank 0 broadcasts, then updates
    assert learner.updates == 1
    idle = ToyLearner(can_update=False)
    assert not updates.step(idle, stop_requested=False, params_changed=False)
    assert idle.updates == 0
    # a stop request keeps the rank running until the group has agreed on it
    assert updates.running(stop_requested=True)
    assert not updates.step(learner, stop_requested=True, params_changed=False)
    assert learner.updates == 1 and not updates.running(stop_requested=True)


def test_a_rank_joins_its_group_at_the_rendezvous_rank_0_opened():
    rendezvous = Rendezvous(0, 1, "127.0.0.1", None, timeout_s=10)
    assert rendezvous.address == ("127.0.0.1", rendezvous.store.port)
    updates = DataParallelUpdates.open(rendezvous, "cpu")
    try:
        assert updates.dp.world_size == 1 and updates.average_gradients == updates.dp.average_gradients
        learner = ToyLearner()
        assert updates.step(learner, stop_requested=False, params_changed=False) and learner.updates == 1
    finally:
        updates.close()
        rendezvous.close()
    assert LocalUpdates().average_gradients is None  # alone in its group: nothing averaged


def test_a_rank_without_the_rendezvous_address_is_refused_before_it_joins():
    with pytest.raises(ValueError, match="rank 1 of a data-parallel group needs the rendezvous store's address"):
        DataParallelUpdates.open(Rendezvous(1, 2, "127.0.0.1", None, timeout_s=10), "cpu")


def test_gossip_sync_opens_its_own_publisher_to_the_other_groups():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    topic = LocalTopic()
    try:
        peers = {"group": 2, "publish_to": [], "inboxes": {"1": "gossip-r-2-from-1"}}
        sync = GossipSync.open(peers, {1: topic.subscribe()}, 0.0, loop=loop, connection_args={})
        assert isinstance(sync.publisher, TopicPublisher) and sync.gossip.group == 2
        topic.publish(1, {"params": {"w": np.full(2, 4.0, np.float32)}, "group": np.array(1)})
        learner = ToyLearner()
        assert sync.apply(learner)
        np.testing.assert_array_equal(learner.loaded[-1]["w"], np.full(2, 2.0, np.float32))
        sync.close()
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        loop.close()
