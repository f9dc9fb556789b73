"""The PPO balance controller's count: how many rollouts an actor may make before the learner's
next version.

A learner iteration takes ``rollouts_per_update`` rollouts per learner and may use each
``sample_reuse`` times, so a version needs ``rollouts_per_update x learners / (actors x
sample_reuse)`` new rollouts from each actor; the band allows ``1 + ratio_tolerance`` times
that, rounded down, never less than one: ``per_version``. An actor starts with ``per_version +
ahead`` rollouts of credit (``algo.rollouts_ahead``, 1 by default: the rollouts it makes while the
learner trains on the version before, each a version stale when trained on), each rollout it
opens spends one, and each new version gives back ``per_version`` (times the versions it
advanced), never above ``per_version + ahead``. With an iteration of several shorter rollouts,
``ahead`` below ``per_version`` overlaps only part of the sampling with training, and only that
part is a version stale.

The count runs across versions: an actor faster than its learner makes ``per_version`` rollouts
a version once it is ``ahead`` ahead, as many as the learner takes, so none is made only to be dropped
as stale. Credit grows with versions, not with a consumption count: rollouts that go stale
and are dropped would never be counted as consumed, and both sides could wait for each other.
A rollout dropped unused (one that arrives more than ``max_policy_lag`` versions late; the buffer
of a balanced run hands the learner the oldest rollouts first) is refunded to the actor that made
it: the learner publishes each actor's count of them with every version. Without the refund each drop
would cost its actor one rollout of lead for good, and once every actor had lost its ``ahead``
they would all wait for each version and the learner for each rollout: serial training.
"""

from __future__ import annotations


def rollouts_per_version(rollouts_per_update: int, learners: int, actors: int, sample_reuse: int, tol: float) -> int:
    """One actor's share of the new rollouts a version needs, within the band, at least one."""
    share = rollouts_per_update * learners / (actors * sample_reuse)
    return max(1, int(share * (1.0 + tol)))


class RolloutCredit:
    """``spend()`` per rollout opened, ``new_version(v, dropped)`` per version received (``dropped``:
    this actor's rollouts the learner's buffer has dropped unused so far); ``exhausted``: the
    actor waits for the next version."""

    def __init__(self, per_version: int, ahead: int = 1):
        self.per_version = per_version
        self.cap = per_version + ahead
        self.left = self.cap
        self._version: int | None = None
        self._dropped = 0

    @property
    def exhausted(self) -> bool:
        return self.left <= 0

    def spend(self) -> None:
        self.left -= 1

    def new_version(self, version: int, dropped: int = 0) -> None:
        # the first version refills nothing (credit starts full); a version that did not move
        # forward (a learner restored from an older checkpoint) counts as one iteration; a drop
        # count below the last one is a new learner's (restarted): nothing to refund
        refund = max(dropped - self._dropped, 0)
        self._dropped = dropped
        if self._version is not None:
            advanced = max(version - self._version, 1)
            self.left = min(self.left + self.per_version * advanced + refund, self.cap)
        self._version = version
