"""The on-policy buffer role: holds recent rollouts and hands them to the learner.

Each rollout carries the policy version that produced it. ``take(version)`` drops rollouts
more than ``algo.max_policy_lag`` versions behind (counted in ``stale_dropped``) and returns
``algo.rollouts_per_update`` rollouts that were used fewer than ``algo.sample_reuse`` times, or
nothing while fewer are there (a learner iteration always trains on a full batch); each use is
counted against the rollout. Which ones depends on the balance controller
(``algo.ratio_tolerance``): with it off, actors make more than the learner takes and it gets the
newest, the least stale; with it on, actors make what the learner takes and it gets the oldest
(by policy version) first, so that a rollout that arrived a little late is trained on instead of
going stale behind another actor's newer one. Rollouts dropped unused are also counted per actor
(``dropped_by_actor``), which the learner publishes so the actors' balance controller refunds them
(:mod:`tianji_dask.algos.ppo.pacing`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tianji_dask.channels.ports import Inbox
from tianji_dask.config.schema import PPOConfig
from tianji_dask.roles.buffer import BufferBase

if TYPE_CHECKING:
    from tianji_dask.config.schema import ExperimentConfig


@dataclass
class Rollout:
    data: dict
    version: int
    created: float
    transitions: int
    actor: int
    uses: int = 0


class RolloutBufferRole(BufferBase):
    def __init__(self, cfg: ExperimentConfig, inbox: Inbox, buffer_id: int = 0):
        super().__init__(inbox, buffer_id)
        self.cfg = cfg
        self.algo = cfg.algo_as(PPOConfig)
        self._held: list[Rollout] = []
        self.stale_dropped = 0  # transitions
        self._dropped_by_actor: Counter[int] = Counter()  # rollouts
        # at most this many rollouts are kept: the ones a learner iteration could still use
        self.capacity_rollouts = self.algo.rollouts_per_update * self.algo.sample_reuse * max(1, cfg.topology.actors)
        self.oldest_first = self.algo.ratio_tolerance is not None

    def __len__(self) -> int:
        with self._lock:
            return sum(r.transitions for r in self._held)

    def _add(self, payload: dict) -> int:
        version, created, transitions = int(payload["version"]), float(payload["created"]), int(payload["rewards"].size)
        r = Rollout(payload, version, created, transitions, int(payload.get("actor", -1)))
        with self._lock:
            self._held.append(r)
            while len(self._held) > self.capacity_rollouts:  # oldest first out
                old = self._held.pop(0)
                if old.uses == 0:
                    self._drop(old)
        return r.transitions

    def _drop(self, r: Rollout) -> None:
        """Count ``r`` as dropped unused (the lock held)."""
        self.stale_dropped += r.transitions
        if r.actor >= 0:  # -1: a rollout that names no actor
            self._dropped_by_actor[r.actor] += 1

    def dropped_by_actor(self) -> np.ndarray:
        """Rollouts dropped unused so far, by the id of the actor that made them (index = id)."""
        with self._lock:
            counts = np.zeros(max(self._dropped_by_actor, default=-1) + 1, np.int64)
            for actor, n in self._dropped_by_actor.items():
                counts[actor] = n
        return counts

    def take(self, learner_version: int) -> list[Rollout]:
        algo = self.algo
        with self._lock:
            keep = []
            for r in self._held:
                if learner_version - r.version > algo.max_policy_lag:
                    if r.uses == 0:
                        self._drop(r)
                else:
                    keep.append(r)
            self._held = keep
            # oldest: by version (the nearest to going stale first), then arrival
            order = sorted(keep, key=lambda r: r.version) if self.oldest_first else reversed(keep)
            usable = [r for r in order if r.uses < algo.sample_reuse][: algo.rollouts_per_update]
            if len(usable) < algo.rollouts_per_update:
                return []  # an iteration trains on a full batch, as the serial algorithm does
            for r in usable:
                r.uses += 1
            self._held = [r for r in keep if r.uses < algo.sample_reuse]
            return usable

    def _fill(self) -> dict[str, Any]:
        with self._lock:
            size = sum(r.transitions for r in self._held)
        capacity = self.capacity_rollouts * self.algo.rollout_steps * self.cfg.env.num_envs
        return {"size": size, "capacity": capacity, "stale_dropped": self.stale_dropped}
