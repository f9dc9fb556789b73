"""The buffer role: receives trajectory chunks asynchronously into a bounded replay memory
and serves sampled batches to the learner that shares its process. Atari runs use the
:class:`~tianji_dask.roles.frame_replay.FrameReplay` (each frame stored once)."""

from __future__ import annotations

import threading
import time

import numpy as np

from tianji_dask.roles.frame_replay import FrameReplay
from tianji_dask.roles.replay import ReplayMemory


def replay_nbytes(cfg, obs_shape: tuple[int, ...], obs_dtype, capacity: int | None = None) -> int:
    """Bytes of the replay memory one DQN buffer of this config fills; ``capacity`` replaces
    ``algo.buffer_size``."""
    capacity = cfg.algo.buffer_size if capacity is None else capacity
    if cfg.env.frame_stacks:
        return FrameReplay.nbytes_for(capacity, _frame_shape(obs_shape))
    return ReplayMemory.nbytes_for(capacity, obs_shape, obs_dtype)


def _frame_shape(obs_shape: tuple[int, ...]) -> tuple[int, int]:
    """(height, width) of one frame of an Atari observation (stack, height, width)."""
    _, height, width = obs_shape
    return height, width


class ReplayBufferRole:
    """Protocol: ``ingest(timeout)`` in the buffer's own loop moves whatever the inbox holds
    into replay (taking an item returns its credit to the sender); the learner calls
    ``sample(n)`` and reads ``len(buffer)`` / ``received`` from its own thread."""

    def __init__(self, cfg, inbox, obs_shape, obs_dtype, seed: int, buffer_id: int = 0):
        self.id = buffer_id
        self.inbox = inbox
        self.replay: FrameReplay | ReplayMemory
        if cfg.env.frame_stacks:  # obs_shape (4, 84, 84): stacks of single frames
            self.replay = FrameReplay(cfg.algo.buffer_size, _frame_shape(obs_shape), obs_shape[0])
        else:
            self.replay = ReplayMemory(cfg.algo.buffer_size, obs_shape, obs_dtype)
        self.rng = np.random.default_rng(seed)
        self._lock = threading.Lock()
        self.received = 0
        self.received_bytes = 0

    def __len__(self) -> int:
        return len(self.replay)

    def ingest(self, timeout: float = 0.0) -> int:
        items = self.inbox.get(timeout) if timeout > 0 else self.inbox.poll()
        n = 0
        for item in items:
            with self._lock:
                self.replay.add(item.payload)
            k = len(item.payload["actions"])
            n += k
            self.received_bytes += item.nbytes
        self.received += n
        return n

    def sample(self, n: int) -> dict[str, np.ndarray]:
        with self._lock:
            return self.replay.sample(n, self.rng)

    def heartbeat(self) -> dict:
        gaps = int(self.inbox.stats().get("seq_gaps", 0))
        return {
            "role": "buffer",
            "id": self.id,
            "t": time.time(),
            "episodes": [],
            "counters": {
                "received": self.received,
                "received_bytes": self.received_bytes,
                "size": len(self.replay),
                "capacity": self.replay.capacity,
                "seq_gaps": gaps,
            },
        }
