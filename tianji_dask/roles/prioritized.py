"""Proportional prioritized replay (Schaul et al. 2016; Ape-X, Horgan et al. 2018) over either
replay memory (:class:`~tianji_dask.roles.buffer.ReplayMemory`,
:class:`~tianji_dask.roles.frame_replay.FrameReplay`).

Transition i is drawn with probability P(i) = p_i^alpha / sum_k p_k^alpha, where p_i = |delta_i|
+ eps is its last absolute TD error, and the learner weights its loss by the importance weight
w_i = (N P(i))^-beta / max_k w_k (N: transitions stored; the max over all of them, from the
smallest priority), so weights only scale updates down. A new transition enters with the
priority its actor computed (``priorities`` in the chunk: :mod:`tianji_dask.algos.dqn.priorities`),
or, without one, the largest priority seen so far; the learner's updates then give it its own.

Where the priorities travel: nowhere. The buffer and the learner share a process, so the
learner hands the TD errors of the batch it just trained on straight to the buffer
(``update_priorities``) under the buffer's lock: no message, no waiting. A slot that the
buffer's thread overwrote with a newer transition in between keeps the newer one's priority
(each slot remembers which add wrote it).

``state()``/``restore()`` are the memory's plus the priorities: which add wrote each slot rides
with the transitions (only new rows in a delta), the priorities of the filled slots are sent
whole (the learner changes them anywhere).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tianji_dask.roles.replay_state import ReplayMark, ReplayState
from tianji_dask.roles.sum_tree import SumTree

MAX_RESAMPLES = 64


@dataclass(frozen=True)
class PrioritySettings:
    alpha: float  # how much the priorities count: 0 uniform, 1 proportional
    beta: float  # importance-weight exponent at the start, annealed linearly to 1 ...
    beta_steps: int  # ... over this many transitions received by the buffer
    eps: float  # added to |delta| so that no transition's probability is zero

    def beta_at(self, received: int) -> float:
        return self.beta + (1.0 - self.beta) * min(1.0, received / self.beta_steps)


class PrioritizedReplay:
    """``add(batch)``, ``sample(n, rng, beta)`` (the batch plus ``weights`` and ``keys``) and
    ``update_priorities(keys, td_errors)``. Not thread-safe: the buffer role serialises access."""

    def __init__(self, memory, settings: PrioritySettings):
        self.memory = memory
        self.settings = settings
        self.capacity = memory.capacity
        self.tree = SumTree(memory.capacity)
        self.max_priority = 1.0
        self._writes = 0
        self._written_by = np.zeros(memory.capacity, np.int64)  # which add() wrote each slot

    def __len__(self) -> int:
        return len(self.memory)

    @property
    def nbytes(self) -> int:
        return self.memory.nbytes + self.tree.nbytes + self._written_by.nbytes

    @staticmethod
    def extra_nbytes(capacity: int) -> int:
        """Bytes the priorities add to a memory of ``capacity`` transitions (what ``nbytes`` adds)."""
        leaves = 1 << max(0, (capacity - 1).bit_length())
        return 2 * 2 * leaves * 8 + capacity * 8

    def filled_nbytes(self) -> int:
        """Bytes of a full :meth:`state`: the memory's filled part, its slots' writers and priorities."""
        return self.memory.filled_nbytes() + len(self.memory) * (8 + 8)

    def state(self, since: ReplayMark | None = None) -> ReplayState:
        st = self.memory.state(since, extra={"written_by": self._written_by})
        st.kind = f"prioritized-{st.kind}"
        st.values.update(
            priorities=self.tree[np.arange(len(self.memory))].copy(),  # p^alpha of the filled slots
            max_priority=self.max_priority,
            writes=self._writes,
        )
        return st

    def restore(self, state: ReplayState) -> None:
        if not state.kind.startswith("prioritized-"):
            raise ValueError(f"a {state.kind!r} replay state cannot restore a prioritized replay")
        values = {k: v for k, v in state.values.items() if k not in ("priorities", "max_priority", "writes")}
        inner = ReplayState(state.kind.removeprefix("prioritized-"), state.token, state.rings, values)
        self.memory.restore(inner, extra={"written_by": self._written_by})
        scaled = np.asarray(state.values["priorities"], np.float64)
        if len(scaled) != len(self.memory):
            raise ValueError(f"replay state: {len(scaled)} priorities for {len(self.memory)} transitions")
        self.tree = SumTree(self.capacity)
        self.tree.update(np.arange(len(scaled)), scaled)
        self.max_priority = float(state.values["max_priority"])
        self._writes = int(state.values["writes"])

    def add(self, batch: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        idx, rows = self.memory.add(batch)
        if len(idx):
            self._writes += 1
            self._written_by[idx] = self._writes
            given = batch.get("priorities")  # the actors' own (Ape-X), else the largest seen
            if given is None:
                p = np.full(len(idx), self.max_priority)
            else:
                p = np.abs(np.asarray(given, np.float64)[rows]) + self.settings.eps
                self.max_priority = max(self.max_priority, float(p.max()))
            self.tree.update(idx, p**self.settings.alpha)
        return idx, rows

    def sample(self, n: int, rng: np.random.Generator, beta: float) -> dict[str, np.ndarray]:
        if len(self.memory) == 0:
            raise ValueError("cannot sample from an empty replay memory")
        idx = self.tree.sample(n, rng)
        for _ in range(MAX_RESAMPLES):  # a frame replay's oldest transitions can lose a frame
            bad = ~self.memory.valid(idx)
            if not bad.any():
                break
            self.tree.update(idx[bad], np.zeros(int(bad.sum())))
            idx[bad] = self.tree.sample(int(bad.sum()), rng)
        else:
            raise RuntimeError("prioritized replay: no transition with all its frames found")
        batch = self.memory.get(idx)
        batch["weights"] = importance_weights(self.tree[idx], self.tree.total, self.tree.min, len(self.memory), beta)
        batch["keys"] = np.stack([idx, self._written_by[idx]])
        return batch

    def update_priorities(self, keys: np.ndarray, td_errors: np.ndarray) -> None:
        """New priorities |delta| + eps for the transitions ``keys`` named (from ``sample``);
        slots written again since are left with their newer transition's priority."""
        idx, written_by = keys
        same = self._written_by[idx] == written_by
        p = np.abs(np.asarray(td_errors, np.float64)[same]) + self.settings.eps
        if len(p):
            self.max_priority = max(self.max_priority, float(p.max()))
            self.tree.update(idx[same], p**self.settings.alpha)


def importance_weights(scaled: np.ndarray, total: float, smallest: float, n: int, beta: float) -> np.ndarray:
    """w_i = (n P(i))^-beta / max_k w_k with P(i) = scaled_i / total, the max from the smallest
    scaled priority ``smallest`` (scaled: p^alpha)."""
    w = (n * np.asarray(scaled, np.float64) / total) ** -beta
    w_max = (n * smallest / total) ** -beta
    return (w / w_max).astype(np.float32)
