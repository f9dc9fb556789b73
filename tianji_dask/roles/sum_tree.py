"""A sum-tree over a fixed number of non-negative priorities, vectorised with numpy: proportional
sampling and batched updates in O(log capacity) numpy operations, whatever the batch size
(Schaul et al. 2016, "Prioritized Experience Replay", appendix B.2.1).

The leaves are the priorities; every inner node holds the sum of its two children, and a
parallel tree holds their minimum (for the importance weights' normalisation). A batch update
writes its leaves, then recomputes the parents of the touched nodes one level at a time.
"""

from __future__ import annotations

import numpy as np


class SumTree:
    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"sum-tree capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self._leaves = 1 << max(0, (self.capacity - 1).bit_length())  # a power of two >= capacity
        self._sum = np.zeros(2 * self._leaves, np.float64)
        self._min = np.full(2 * self._leaves, np.inf)

    @property
    def total(self) -> float:
        return float(self._sum[1])

    @property
    def nbytes(self) -> int:
        return self._sum.nbytes + self._min.nbytes

    @property
    def min(self) -> float:
        """The smallest priority above zero (inf when there is none)."""
        return float(self._min[1])

    def __getitem__(self, idx) -> np.ndarray:
        return self._sum[self._leaves + np.asarray(idx)]

    def update(self, idx: np.ndarray, priorities: np.ndarray) -> None:
        """Set the priorities of leaves ``idx`` (for a repeated index the last value wins)."""
        idx = np.asarray(idx, np.int64)
        p = np.asarray(priorities, np.float64)
        if idx.size == 0:
            return
        if idx.min() < 0 or idx.max() >= self.capacity:
            raise IndexError(f"sum-tree index out of range 0..{self.capacity - 1}")
        if (p < 0).any() or not np.isfinite(p).all():
            raise ValueError("priorities must be finite and >= 0")
        nodes = idx + self._leaves
        self._sum[nodes] = p
        self._min[nodes] = np.where(p > 0, p, np.inf)
        nodes = np.unique(nodes >> 1)
        while nodes[0] >= 1:
            left, right = 2 * nodes, 2 * nodes + 1
            self._sum[nodes] = self._sum[left] + self._sum[right]
            self._min[nodes] = np.minimum(self._min[left], self._min[right])
            if nodes[0] == 1:
                break
            nodes = np.unique(nodes >> 1)

    def find(self, mass: np.ndarray) -> np.ndarray:
        """The leaf of each prefix sum ``mass`` (0 <= mass < total): the first leaf whose
        cumulative priority exceeds it. Leaves of priority zero are never returned."""
        mass = np.array(mass, np.float64, copy=True)
        node = np.ones(len(mass), np.int64)
        while node[0] < self._leaves:  # every node is on the same level
            left = 2 * node
            go_right = mass >= self._sum[left]
            mass -= np.where(go_right, self._sum[left], 0.0)
            node = left + go_right
        leaf = node - self._leaves
        # rounding can step onto an empty leaf at the very end of the mass: take the last non-empty one
        empty = self._sum[node] <= 0
        if empty.any():
            nonzero = np.flatnonzero(self._sum[self._leaves : self._leaves + self.capacity] > 0)
            leaf[empty] = nonzero[np.searchsorted(nonzero, leaf[empty], side="right").clip(1) - 1]
        return leaf

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` leaves drawn in proportion to their priorities, one from each of ``n`` equal
        strata of the total (lower variance than ``n`` independent draws)."""
        total = self.total
        if total <= 0:
            raise ValueError("cannot sample from a sum-tree whose priorities are all zero")
        mass = (np.arange(n) + rng.random(n)) * (total / n)
        return self.find(np.minimum(mass, np.nextafter(total, 0)))
