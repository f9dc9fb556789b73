"""The buffer role: receives trajectory chunks asynchronously into a bounded replay memory
and serves sampled batches to the learner that shares its process. Atari runs use the
:class:`~tianji_dask.roles.frame_replay.FrameReplay` (each frame stored once)."""

from __future__ import annotations

from typing import Any

import numpy as np

from tianji_dask.roles.buffer_base import BufferBase
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


class ReplayBufferRole(BufferBase):
    """The buffer's own loop ingests into replay (:class:`BufferBase`); the learner calls
    ``sample(n)`` and reads ``len(buffer)`` / ``received`` from its own thread."""

    def __init__(self, cfg, inbox, obs_shape, obs_dtype, seed: int, buffer_id: int = 0):
        super().__init__(inbox, buffer_id)
        self.replay: FrameReplay | ReplayMemory
        if cfg.env.frame_stacks:  # obs_shape (4, 84, 84): stacks of single frames
            self.replay = FrameReplay(cfg.algo.buffer_size, _frame_shape(obs_shape), obs_shape[0])
        else:
            self.replay = ReplayMemory(cfg.algo.buffer_size, obs_shape, obs_dtype)
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return len(self.replay)

    def _add(self, payload: dict) -> int:
        with self._lock:
            self.replay.add(payload)
        return len(payload["actions"])

    def sample(self, n: int) -> dict[str, np.ndarray]:
        with self._lock:
            return self.replay.sample(n, self.rng)

    def _fill(self) -> dict[str, Any]:
        return {"size": len(self.replay), "capacity": self.replay.capacity}
