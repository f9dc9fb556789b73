"""Asynchronous parameter averaging between training groups, gossip style (as GALA/PALA).

Every ``sync_interval_s`` a group's lead learner publishes a snapshot of its parameters to
the other groups' lead learners (over the channel layer's topic: newest version wins), then
averages its own parameters with the newest snapshot it holds from each other group. One
inbox per peer group, so an average combines exactly one recent snapshot per group (the
original TianJi code averaged whichever snapshots arrived first, sometimes two from one
group). Snapshots older than ``max_age_s`` are left out. Nothing waits.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import numpy as np

from tianji_dask.channels import ChannelService, TopicPublisher
from tianji_dask.channels.ports import ParamSource, Publisher
from tianji_dask.errors import ChannelError
from tianji_dask.roles.loop import LearnerLoopRole


class GroupGossip:
    """Protocol: ``due()`` cheap check; ``exchange(own_params)`` -> ``(averaged, distance, n_peers)``."""

    def __init__(
        self,
        group: int,
        publisher: Publisher,
        inboxes: Mapping[int, ParamSource],
        interval_s: float,
        max_age_s: float | None = None,
        clock=time.monotonic,
    ):
        self.group = group
        self.publisher = publisher
        self.inboxes = inboxes  # peer group id -> inbox with probe()
        self.interval_s = interval_s
        self.max_age_s = max_age_s if max_age_s is not None else 3 * interval_s
        self.clock = clock
        self.latest: dict[int, tuple[float, dict]] = {}  # peer group -> (received at, params)
        self.rounds = 0
        self.send_errors = 0
        self._next = clock() + interval_s

    def due(self) -> bool:
        return self.clock() >= self._next

    def exchange(self, own: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float, int]:
        now = self.clock()
        self._next = now + self.interval_s
        self.rounds += 1
        try:  # a peer group that is gone must not stop this one
            self.publisher.publish(
                self.rounds, {"params": {k: v.copy() for k, v in own.items()}, "group": np.array(self.group)}
            )
        except ChannelError:
            self.send_errors += 1
        for peer, inbox in self.inboxes.items():
            got = inbox.probe()
            if got is not None:
                self.latest[peer] = (now, got[1]["params"])
        peers = [p for t, p in self.latest.values() if now - t <= self.max_age_s]
        if not peers:
            return own, float("nan"), 0
        distance = float(np.mean([parameter_distance(own, p) for p in peers]))
        averaged = {k: np.mean([own[k], *(p[k] for p in peers)], axis=0).astype(own[k].dtype) for k in own}
        return averaged, distance, len(peers)


def parameter_distance(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    """L2 norm of the difference of two parameter sets (all tensors together)."""
    return float(np.sqrt(sum(float(((a[k] - b[k]) ** 2).sum()) for k in a)))


def open_peer_inboxes(peers: dict, *, replace: bool) -> dict[int, ParamSource]:
    """The inboxes of the other groups' snapshots on this worker (``peers["inboxes"]``: peer
    group -> channel), opened as the lead learner is created: a peer may publish before this
    learner's loop starts. ``replace``: a re-created learner's take over its predecessor's."""
    service = ChannelService.current()
    return {int(g): service.open_latest(ch, replace=replace) for g, ch in peers["inboxes"].items()}


def close_peer_inboxes(peers: dict, worker) -> None:
    for ch in peers["inboxes"].values():
        ChannelService.for_worker(worker).close(ch)


class GossipSync:
    """The gossip part of a group's lead learner's loop: averages its policy with the other
    groups' when due."""

    def __init__(self, gossip: GroupGossip):
        self.gossip = gossip

    @classmethod
    def open(cls, peers: dict, inboxes: Mapping[int, ParamSource], interval_s: float, **comm) -> GossipSync:
        """A lead learner's gossip, its publisher to the other groups' leads built (``peers``:
        ``{"group": g, "publish_to": [(address, channel)], ...}``; ``comm``: the publisher's
        event loop and connection arguments), in the learner's loop thread."""
        publisher = TopicPublisher([tuple(x) for x in peers["publish_to"]], **comm)
        return cls(GroupGossip(int(peers["group"]), publisher, inboxes, interval_s))

    @property
    def publisher(self):
        return self.gossip.publisher

    def apply(self, learner: LearnerLoopRole) -> bool:
        """Average when due; True if the learner's parameters changed."""
        if not self.gossip.due():
            return False
        averaged, distance, peers = self.gossip.exchange(learner.policy_params())
        learner.record_gossip(self.gossip.rounds, distance)
        if peers:
            learner.load_policy_params(averaged)
        return bool(peers)

    def close(self) -> None:
        self.gossip.publisher.close(timeout=1.0)
