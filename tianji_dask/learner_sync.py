"""The parts of a learner's loop besides the update itself, each separate and composable.

A learner host's step is: answer a pending snapshot request (:class:`SnapshotRequests`), average
with the other groups when due (:class:`GossipSync`), then update, alone (:class:`LocalUpdates`)
or in agreement with the other ranks of its group (:class:`DataParallelUpdates`). Each part
works on the learner role's public methods only.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from typing import Any, Protocol

from tianji_dask.dataparallel import DataParallel
from tianji_dask.gossip import GroupGossip

IDLE_S = 0.0002  # a learner with nothing to train on yields this long before looking again


class SyncedLearner(Protocol):
    """What the sync parts need of a learner role (``roles.learner_base.LearnerBase`` has it)."""

    @property
    def module(self) -> Any: ...
    def step(self) -> bool: ...
    def wants_update(self) -> bool: ...
    def update(self) -> Any: ...
    def policy_params(self) -> dict: ...
    def load_policy_params(self, params: dict) -> None: ...
    def record_gossip(self, rounds: int, distance: float) -> None: ...


class SnapshotRequests:
    """Hands a copy of the learner's state from its loop thread to a caller on another thread.

    A copy taken from outside the loop could catch an update halfway, so the caller asks
    (:meth:`request`) and the loop answers between two updates (:meth:`serve`)."""

    def __init__(self) -> None:
        self._wanted: concurrent.futures.Future | None = None

    def request(self) -> concurrent.futures.Future:
        want: concurrent.futures.Future = concurrent.futures.Future()
        self._wanted = want
        return want

    def serve(self, take: Callable[[], Any]) -> None:
        """In the loop thread: answer the pending request, if any, with ``take()``."""
        if self._wanted is None:  # the usual case, every step: read only, so no request is overwritten
            return
        want, self._wanted = self._wanted, None
        try:
            want.set_result(take())
        except Exception as exc:  # noqa: BLE001 - the caller reports it; the loop goes on
            want.set_exception(exc)

    def cancel(self, reason: str) -> None:
        """As the loop ends: answer a pending request with an error rather than let it time out."""
        want, self._wanted = self._wanted, None
        if want is not None:
            want.set_exception(RuntimeError(reason))


class GossipSync:
    """A group's lead learner averaging its policy with the other groups' (see :mod:`gossip`)."""

    def __init__(self, gossip: GroupGossip):
        self.gossip = gossip

    def apply(self, learner: SyncedLearner) -> bool:
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


class LocalUpdates:
    """A learner alone in its group: it updates whenever it can and stops when asked."""

    def running(self, stop_requested: bool) -> bool:
        return not stop_requested

    def step(self, learner: SyncedLearner, stop_requested: bool, params_changed: bool) -> None:
        if not learner.step():
            time.sleep(IDLE_S)

    def close(self) -> None:
        pass


class DataParallelUpdates:
    """One rank of a data-parallel group: every step the ranks agree whether all can update,
    whether one is stopping (then all stop together, so no rank waits in a collective for a
    rank that left) and whether rank 0 broadcasts parameters that gossip changed."""

    def __init__(self, dp: DataParallel):
        self.dp = dp
        self._stopped = False

    def running(self, stop_requested: bool) -> bool:
        return not self._stopped  # a stop request reaches the others through the next agreement

    def step(self, learner: SyncedLearner, stop_requested: bool, params_changed: bool) -> None:
        everyone, stopping, broadcast = self.dp.agree(learner.wants_update(), stop_requested, params_changed)
        if stopping:
            self._stopped = True
            return
        if broadcast:
            self.dp.broadcast(learner.module)
        if everyone:
            learner.update()
        else:
            time.sleep(IDLE_S)

    def close(self) -> None:
        self.dp.close()
