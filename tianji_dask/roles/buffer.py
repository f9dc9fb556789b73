"""The buffer roles. :class:`BufferBase` is what every buffer shares: taking what the inbox
holds, counting it, the loop step and the heartbeat; a subclass stores one payload (``_add``)
and reports its fill (``_fill``). :class:`ReplayBufferRole` is the buffer of off-policy
algorithms: a bounded replay memory the learner in the same process samples from (Atari runs
use :class:`~tianji_dask.roles.frame_replay.FrameReplay`: each frame stored once), uniform or
prioritized (:class:`~tianji_dask.roles.prioritized.PrioritizedReplay`)."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import numpy as np

from tianji_dask.channels.ports import Inbox
from tianji_dask.roles.frame_replay import FrameReplay
from tianji_dask.roles.heartbeats import BufferCounters, Heartbeat
from tianji_dask.roles.prioritized import PrioritizedReplay, PrioritySettings
from tianji_dask.roles.replay import ReplayMemory
from tianji_dask.roles.replay_state import ReplayMark, ReplayState

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
