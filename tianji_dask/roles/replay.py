"""Transitions for off-policy learners: how actors make them and where buffers keep them.

:class:`NStepWindow` makes n-step transitions from a vector env, in the actor (as Ape-X does).
For each env the last ``n`` steps are kept; once the window is full, every step emits the
transition that starts at the window's oldest step::

    (obs_t, a_t, R = sum_{j<=k} gamma^j r_{t+j}, next_obs = s'_{t+k}, discount = gamma^(k+1) * (1 - terminated_{t+k}))

where ``k`` is the first step of the window whose episode ended (else ``n - 1``). A
transition never crosses an episode boundary; truncated episodes bootstrap from their
final observation. With ``n = 1`` this is the ordinary one-step transition.

:class:`ReplayMemory` keeps them: a ring buffer of preallocated numpy arrays. Memory is fixed
by ``capacity`` at construction (``nbytes``), insertion overwrites the oldest transitions and
sampling is O(batch) with vectorised indexing. ``state()``/``restore()`` copy its filled part
out and back (:mod:`tianji_dask.roles.replay_state`), or only what changed since an earlier state.
"""

from __future__ import annotations

import uuid

import numpy as np

from tianji_dask.roles.replay_state import ReplayMark, ReplayState, mark_for, put_ring, take_arrays


class NStepWindow:
    """``add(obs, actions, rewards, next_obs, terminated, done)`` per vector step; returns the
    emitted transitions (a dict of arrays, one row per env) or None while the window fills."""

    def __init__(self, n: int, gamma: float, num_envs: int, obs_shape, obs_dtype=np.float32):
        self.n, self.gamma = n, gamma
        self._obs = np.zeros((n, num_envs, *obs_shape), obs_dtype)
        self._next = np.zeros((n, num_envs, *obs_shape), obs_dtype)
        self._act = np.zeros((n, num_envs), np.int64)
        self._rew = np.zeros((n, num_envs), np.float32)
        self._term = np.zeros((n, num_envs), bool)
        self._done = np.zeros((n, num_envs), bool)
        self._count = 0
        self._powers = gamma ** np.arange(n + 1, dtype=np.float64)
        self._envs = np.arange(num_envs)

    def add(self, obs, actions, rewards, next_obs, terminated, done):
        i = self._count % self.n
        self._obs[i], self._act[i], self._rew[i] = obs, actions, rewards
        self._next[i], self._term[i], self._done[i] = next_obs, terminated, done
        self._count += 1
        if self._count < self.n:
            return None
        order = (np.arange(self.n) + self._count) % self.n  # oldest first
        done = self._done[order]
        # k = first step whose episode ended, else n-1; steps after k are not part of this transition
        ended = done.any(axis=0)
        k = np.where(ended, done.argmax(axis=0), self.n - 1)
        within = np.arange(self.n)[:, None] <= k[None, :]
        ret = (self._rew[order] * self._powers[: self.n, None] * within).sum(axis=0)
        last = order[k]
        discount = self._powers[k + 1] * (1.0 - self._term[last, self._envs])
        first = order[0]
        return {
            "obs": self._obs[first].copy(),
            "actions": self._act[first].copy(),
            "rewards": ret.astype(np.float32),
            "next_obs": self._next[last, self._envs],
            "discounts": discount.astype(np.float32),
        }


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
        self.written = 0  # rows written into the ring: the next goes to written % capacity
        self.token = uuid.uuid4().hex  # names these contents for state(since=...)

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

    def add(self, batch: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Store ``batch``; returns the ring indices written and the batch rows they hold."""
        n = len(batch["actions"])
        self.added += n
        rows = np.arange(n)[-self.capacity :]  # keep only the newest transitions
        idx = (self._pos + np.arange(len(rows))) % self.capacity
        for k in FIELDS:
            self._data[k][idx] = batch[k][rows] if len(rows) < n else batch[k]
        self._pos = int((self._pos + len(rows)) % self.capacity)
        self._size = min(self._size + len(rows), self.capacity)
        self.written += len(rows)
        return idx, rows

    def filled_nbytes(self) -> int:
        """Bytes of the filled part: what a full :meth:`state` copies."""
        return self._size * (self.nbytes // self.capacity)

    def state(self, since: ReplayMark | None = None, extra: dict[str, np.ndarray] | None = None) -> ReplayState:
        """The contents up to the fill, the write position and the counters; with ``since`` (a
        mark of an earlier state of this memory) only the transitions written after it.
        ``extra``: more arrays indexed by ring row, carried with the transitions (a wrapper's)."""
        arrays = {**self._data, **(extra or {})}
        ring = take_arrays(arrays, self.capacity, self.written, mark_for(self.token, since, "transitions"))
        return ReplayState("uniform", self.token, {"transitions": ring}, {"added": self.added})

    def restore(self, state: ReplayState, extra: dict[str, np.ndarray] | None = None) -> None:
        """Hold exactly what ``state`` (a full one) held; ``extra`` as in :meth:`state`."""
        if state.kind != "uniform":
            raise ValueError(f"a {state.kind!r} replay state cannot restore a uniform replay memory")
        arrays = {**self._data, **(extra or {})}
        ring = state.rings["transitions"]
        if set(ring.arrays) != set(arrays):
            raise ValueError(f"replay state fields {sorted(ring.arrays)} differ from the memory's {sorted(arrays)}")

        def put(rows: np.ndarray, values: dict[str, np.ndarray]) -> None:
            for k, a in arrays.items():
                a[rows] = values[k]

        put_ring(ring, put, self.capacity)
        self.written = ring.total
        self._pos = ring.total % self.capacity
        self._size = ring.rows
        self.added = int(state.values["added"])
        self.token = state.token

    def valid(self, idx: np.ndarray) -> np.ndarray:
        """Every stored transition is whole (the frame replay's can lose frames)."""
        return np.ones(len(idx), bool)

    def get(self, idx: np.ndarray) -> dict[str, np.ndarray]:
        """The transitions at ring indices ``idx``."""
        return {k: v[idx] for k, v in self._data.items()}

    def sample(self, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        if self._size == 0:
            raise ValueError("cannot sample from an empty replay memory")
        return self.get(rng.integers(0, self._size, size=n))
