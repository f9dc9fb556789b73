"""The buffer roles. :class:`BufferBase` is what every buffer shares: taking what the inbox
holds, counting it, the loop step and the heartbeat; a subclass stores one payload (``_add``)
and reports its fill (``_fill``). :class:`ReplayBufferRole` is the buffer of off-policy
algorithms: a bounded replay memory the learner in the same process samples from (Atari runs
use :class:`~tianji_dask.roles.frame_replay.FrameReplay`: each frame stored once), uniform or
prioritized (:class:`~tianji_dask.roles.prioritized.PrioritizedReplay`).

:class:`ReplayMemory` keeps the transitions of a uniform replay: a ring buffer of preallocated
numpy arrays. Memory is fixed by ``capacity`` at construction (``nbytes``), insertion overwrites
the oldest transitions and sampling is O(batch) with vectorised indexing. ``state()``/``restore()``
copy its filled part out and back (:mod:`tianji_dask.roles.replay_state`), or only what changed
since an earlier state.
"""

from __future__ import annotations

import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import numpy as np

from tianji_dask.channels.ports import Inbox
from tianji_dask.roles.frame_replay import FrameReplay
from tianji_dask.roles.heartbeats import BufferCounters, Heartbeat
from tianji_dask.roles.prioritized import PrioritizedReplay, PrioritySettings
from tianji_dask.roles.replay_state import ReplayMark, ReplayState, mark_for, put_ring, take_arrays

INGEST_WAIT_S = 0.05  # how long one loop step waits for the inbox


class BufferBase(ABC):
    def __init__(self, inbox: Inbox, buffer_id: int):
        self.id = buffer_id
        self.inbox = inbox
        self._lock = threading.Lock()  # the buffer's thread adds, the learner's thread reads
        self.received = 0  # transitions
        self.received_bytes = 0

    @abstractmethod
    def _add(self, payload: dict) -> int:
        """Store one message's payload; returns the transitions it held."""

    @abstractmethod
    def _fill(self) -> dict[str, Any]:
        """``size`` and ``capacity`` in transitions, and any other fields of
        :class:`~tianji_dask.roles.heartbeats.BufferCounters` the buffer keeps itself."""

    def ingest(self, timeout: float = 0.0) -> int:
        """Move whatever the inbox holds into the buffer (waiting up to ``timeout`` for
        something); taking an item returns its credit to the sender. Returns transitions."""
        items = self.inbox.get(timeout) if timeout > 0 else self.inbox.poll()
        n = 0
        for item in items:
            n += self._add(item.payload)
            self.received_bytes += item.nbytes
        self.received += n
        return n

    def step(self) -> bool:
        return self.ingest(INGEST_WAIT_S) > 0

    def heartbeat(self) -> Heartbeat:
        counters = BufferCounters(
            received=self.received,
            received_bytes=self.received_bytes,
            seq_gaps=self.inbox.stats()["seq_gaps"],
            **self._fill(),
        )
        return Heartbeat("buffer", self.id, counters)

    def close(self) -> None:  # noqa: B027 - part of LoopRole; a buffer owns nothing to close
        """The host closes the inbox."""


def replay_nbytes(
    capacity: int, obs_shape: tuple[int, ...], obs_dtype, frame_stacks: bool = False, prioritized: bool = False
) -> int:
    """Bytes of the replay memory a :class:`ReplayBufferRole` of these arguments fills."""
    extra = PrioritizedReplay.extra_nbytes(capacity) if prioritized else 0
    if frame_stacks:
        return FrameReplay.nbytes_for(capacity, _frame_shape(obs_shape)) + extra
    return ReplayMemory.nbytes_for(capacity, obs_shape, obs_dtype) + extra


def _frame_shape(obs_shape: tuple[int, ...]) -> tuple[int, int]:
    """(height, width) of one frame of an Atari observation (stack, height, width)."""
    _, height, width = obs_shape
    return height, width


class ReplayBufferRole(BufferBase):
    """The buffer's own loop ingests into replay (:class:`BufferBase`); the learner calls
    ``sample(n)`` and reads ``len(buffer)`` / ``received`` from its own thread. ``capacity`` in
    transitions; ``frame_stacks``: observations are Atari frame stacks ``(stack, height,
    width)``, kept as single frames (on the torch ``device`` if given: the learner's)."""

    def __init__(
        self,
        inbox: Inbox,
        capacity: int,
        obs_shape: tuple[int, ...],
        obs_dtype,
        *,
        frame_stacks: bool = False,
        seed: int = 0,
        buffer_id: int = 0,
        priorities: PrioritySettings | None = None,
        device: str | None = None,
    ):
        super().__init__(inbox, buffer_id)
        memory: FrameReplay | ReplayMemory
        if frame_stacks:
            memory = FrameReplay(capacity, _frame_shape(obs_shape), obs_shape[0], device=device)
        else:
            memory = ReplayMemory(capacity, obs_shape, obs_dtype)
        self.replay: FrameReplay | ReplayMemory | PrioritizedReplay = (
            memory if priorities is None else PrioritizedReplay(memory, priorities)
        )
        self.priorities = priorities
        self.rng = np.random.default_rng(seed)
        self.restored = 0  # transitions it started with, restored from an earlier buffer's state
        self.received_before = 0  # transitions its predecessors received (a restored buffer's)

    def __len__(self) -> int:
        return len(self.replay)

    def replay_state(self, since: ReplayMark | None, max_bytes: int) -> tuple[ReplayState | None, int]:
        """``(state, bytes)``: the replay's state (:mod:`~tianji_dask.roles.replay_state`; only
        what changed after ``since``, a mark of an earlier state) and the bytes of its filled part;
        no state if those are more than ``max_bytes``. ``received`` at this moment goes with it."""
        with self._lock:
            filled = self.replay.filled_nbytes()
            if filled > max_bytes:
                return None, filled
            state = self.replay.state(since)
            state.values.update(received=self.received, received_before=self.received_before)
        return state, filled

    def restore_replay(self, state: ReplayState) -> None:
        """Before the loop starts: hold what ``state`` (a full one) held."""
        with self._lock:
            self.replay.restore(state)
            self.restored = len(self.replay)
            self.received_before = int(state.values.get("received_before", 0)) + int(state.values.get("received", 0))

    def _add(self, payload: dict) -> int:
        with self._lock:
            self.replay.add(payload)
        return len(payload["actions"])

    def sample(self, n: int) -> dict[str, np.ndarray]:
        """``n`` transitions; prioritized, also their importance ``weights`` and the ``keys``
        that :meth:`update_priorities` takes back."""
        with self._lock:
            if isinstance(self.replay, PrioritizedReplay):
                assert self.priorities is not None
                beta = self.priorities.beta_at(self.received_before + self.received)  # annealing goes on
                return self.replay.sample(n, self.rng, beta)
            return self.replay.sample(n, self.rng)

    def device_sampler(self) -> Callable[[int], dict[str, Any]] | None:
        """For a uniform frame replay on a torch device: a function that draws the given number
        of transitions there with device operations only (:meth:`FrameReplay.sample_on_device`);
        call it while holding :attr:`lock`. None for any other replay."""
        replay = self.replay
        if not isinstance(replay, FrameReplay) or replay.device is None:
            return None
        return replay.sample_on_device

    @property
    def lock(self) -> threading.Lock:
        """Held while the buffer's thread adds to the replay."""
        return self._lock

    def update_priorities(self, keys: np.ndarray, td_errors: np.ndarray) -> None:
        with self._lock:
            assert isinstance(self.replay, PrioritizedReplay)
            self.replay.update_priorities(keys, td_errors)

    def _fill(self) -> dict[str, Any]:
        return {"size": len(self.replay), "capacity": self.replay.capacity}


# ---------------------------------------------------------------------------- the replay memory
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
