"""Bounded uniform replay memory for off-policy learners.

A ring buffer of preallocated numpy arrays: memory is fixed by ``capacity`` at
construction (``nbytes``), insertion overwrites the oldest transitions and
sampling is O(batch) with vectorised indexing.
"""

from __future__ import annotations

import numpy as np

FIELDS = ("obs", "next_obs", "actions", "rewards", "discounts")


class ReplayMemory:
    """Uniform replay of transitions ``(obs, action, reward, next_obs, discount)``.

    ``discount`` is the bootstrap factor of the transition: ``gamma**n`` for an n-step
    transition that did not end its episode, 0 for one that terminated it.

    ``add(batch)`` takes a dict of equally long arrays keyed by :data:`FIELDS`;
    ``sample(n, rng)`` returns a dict of ``n`` transitions drawn uniformly with
    replacement. Not thread-safe: the buffer host serialises access.
    """

    def __init__(self, capacity: int, obs_shape: tuple[int, ...], obs_dtype=np.float32):
        if capacity < 1:
            raise ValueError(f"replay capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self._data = {
            "obs": np.zeros((capacity, *obs_shape), dtype=obs_dtype),
            "next_obs": np.zeros((capacity, *obs_shape), dtype=obs_dtype),
            "actions": np.zeros(capacity, dtype=np.int64),
            "rewards": np.zeros(capacity, dtype=np.float32),
            "discounts": np.zeros(capacity, dtype=np.float32),
        }
        self._pos = 0
        self._size = 0
        self.added = 0

    def __len__(self) -> int:
        return self._size

    @staticmethod
    def nbytes_for(capacity: int, obs_shape: tuple[int, ...], obs_dtype=np.float32) -> int:
        """Bytes of a memory of ``capacity`` transitions (what ``nbytes`` reports once built)."""
        obs = int(np.prod(obs_shape)) * np.dtype(obs_dtype).itemsize
        return int(capacity) * (2 * obs + 8 + 4 + 4)  # obs, next_obs, action, reward, discount

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._data.values())

    def add(self, batch: dict[str, np.ndarray]) -> None:
        n = len(batch["actions"])
        self.added += n
        if n > self.capacity:  # keep only the newest transitions
            batch = {k: v[-self.capacity :] for k, v in batch.items()}
            n = self.capacity
        idx = (self._pos + np.arange(n)) % self.capacity
        for k in FIELDS:
            self._data[k][idx] = batch[k]
        self._pos = int((self._pos + n) % self.capacity)
        self._size = min(self._size + n, self.capacity)

    def sample(self, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        if self._size == 0:
            raise ValueError("cannot sample from an empty replay memory")
        idx = rng.integers(0, self._size, size=n)
        return {k: v[idx] for k, v in self._data.items()}
