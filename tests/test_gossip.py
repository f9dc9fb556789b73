"""Gossip averaging between groups combines exactly one recent snapshot per group."""

import numpy as np
import pytest

from tianji_dask.channels import LocalTopic
from tianji_dask.runtime.hosts.gossip import GroupGossip, parameter_distance


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def params(value):
    return {"w": np.full((2, 2), value, np.float32), "b": np.full(2, value, np.float32)}


def make_groups(n, clock, interval=1.0):
    """n groups, each with one topic to every other group and one inbox per peer group."""
    topics = {(src, dst): LocalTopic() for src in range(n) for dst in range(n) if src != dst}
    inboxes = {(src, dst): topics[src, dst].subscribe() for (src, dst) in topics}

    class Fanout:  # one publisher per group feeding its topic to every peer
        def __init__(self, src):
            self.src = src

        def publish(self, version, payload):
            for dst in range(n):
                if dst != self.src:
                    topics[self.src, dst].publish(version, payload)

    return [
        GroupGossip(g, Fanout(g), {src: inboxes[src, g] for src in range(n) if src != g}, interval, clock=clock)
        for g in range(n)
    ]


def test_average_uses_one_snapshot_per_group_the_newest():
    clock = Clock()
    g0, g1, g2 = make_groups(3, clock)
    clock.t = 1.0
    # group 1 publishes twice before group 0 averages: only its newest snapshot may count
    g1.exchange(params(10.0))
    g1.exchange(params(4.0))
    g2.exchange(params(1.0))
    averaged, distance, peers = g0.exchange(params(1.0))
    assert peers == 2
    np.testing.assert_allclose(averaged["w"], (1.0 + 4.0 + 1.0) / 3)  # not (1 + 10 + 4 + 1) / 4
    expected = np.mean([parameter_distance(params(1.0), params(4.0)), parameter_distance(params(1.0), params(1.0))])
    assert distance == pytest.approx(expected)


def test_old_snapshots_are_left_out_and_nothing_waits():
    clock = Clock()
    g0, g1 = make_groups(2, clock, interval=1.0)
    averaged, distance, peers = g0.exchange(params(2.0))  # nothing from group 1 yet: no wait
    assert peers == 0 and np.isnan(distance)
    np.testing.assert_array_equal(averaged["w"], params(2.0)["w"])
    g1.exchange(params(6.0))
    clock.t = 1.0
    averaged, _, peers = g0.exchange(params(2.0))
    assert peers == 1
    np.testing.assert_allclose(averaged["b"], 4.0)
    clock.t = 1.0 + 3.5  # past max_age_s = 3 * interval: group 1's snapshot is too old now
    averaged, _, peers = g0.exchange(params(2.0))
    assert peers == 0
    np.testing.assert_allclose(averaged["b"], 2.0)


def test_due_follows_the_interval():
    clock = Clock()
    (g0, _) = make_groups(2, clock, interval=2.0)
    assert not g0.due()
    clock.t = 2.0
    assert g0.due()
    g0.exchange(params(0.0))
    assert not g0.due()
