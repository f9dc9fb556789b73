"""The PPO actor's rollout being written: ``T`` rows of every env's step, one row a step.

Atari (``env.kind: atari``): the rollout's observations are frame-id stacks while it is written,
and ``take()`` turns them into positions into the frames it carries (``frames``,
``obs_frames``, ``(T, N, 4)`` int32): each 84x84 frame once, the whole stacks of its first row
and then each step's new frame, as :class:`~tianji_dask.roles.frame_replay.FrameStreams` emits them.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from tianji_dask.roles.frame_replay import FrameStreams


class RolloutWriter:
    """``begin(obs)``, then ``add()`` each step until ``full``; then ``take()``."""

    def __init__(
        self,
        actor_id: int,
        T: int,
        num_envs: int,
        obs_shape: tuple[int, ...],
        obs_dtype: npt.DTypeLike,
        action_shape: tuple[int, ...],
        action_dtype: npt.DTypeLike,
        frame_stacks: bool,
    ):
        self.actor_id = actor_id
        self.T, self.num_envs = T, num_envs
        self._obs_shape, self._obs_dtype = obs_shape, obs_dtype
        self._action_shape, self._action_dtype = action_shape, action_dtype
        self.frames = FrameStreams(actor_id, num_envs, stack=obs_shape[0]) if frame_stacks else None
        self.rows = 0
        self._r: dict[str, np.ndarray] = {}

    @property
    def full(self) -> bool:
        return self.rows == self.T

    def begin(self, obs: np.ndarray) -> None:
        """A new rollout whose first row acts on ``obs``."""
        T, N = self.T, self.num_envs
        if self.frames is None:
            first: dict[str, np.ndarray] = {"obs": np.empty((T, N, *self._obs_shape), self._obs_dtype)}
        else:
            self.frames.take()  # frames emitted by the previous rollout's last step: not needed here
            self.frames.start(obs)  # the first stacks whole: a rollout needs no other
            first = {"obs_ids": np.empty((T, N, self._obs_shape[0]), np.int64)}
        self._r = {
            **first,
            "actions": np.empty((T, N, *self._action_shape), self._action_dtype),
            "logp": np.empty((T, N), np.float32),
            "values": np.empty((T, N), np.float32),
            "rewards": np.empty((T, N), np.float32),
            "dones": np.empty((T, N), np.float32),
        }
        self.rows = 0

    def add(
        self,
        obs: np.ndarray,
        next_obs: np.ndarray,
        ended: np.ndarray,
        infos: dict,
        actions: np.ndarray,
        logp: np.ndarray,
        values: np.ndarray,
        rewards: np.ndarray,
        dones: np.ndarray,
    ) -> bool:
        """The next row: ``obs`` acted on with ``actions`` (``logp``, ``values``), the env's
        ``next_obs``, ``ended`` and ``infos``, the training ``rewards`` and ``dones``. True when
        the rollout is full."""
        r, t = self._r, self.rows
        if self.frames is None:
            r["obs"][t] = obs
        else:
            r["obs_ids"][t] = self.frames.ids
            self.frames.step(next_obs, ended, infos)
        r["actions"][t], r["logp"][t], r["values"][t] = actions, logp, values
        r["rewards"][t], r["dones"][t] = rewards, dones
        self.rows += 1
        return self.full

    def take(self) -> dict[str, np.ndarray]:
        """The full rollout; its arrays are the caller's (``begin`` makes new ones)."""
        assert self.full, (self.rows, self.T)
        r = self._r
        if self.frames is not None:
            frames, ids = self.frames.take()
            r["frames"], r["obs_frames"] = frame_positions(frames, ids, r.pop("obs_ids"), self.actor_id)
        self._r = {}
        return r


def frame_positions(
    frames: np.ndarray, ids: np.ndarray, obs_ids: np.ndarray, actor_id: int
) -> tuple[np.ndarray, np.ndarray]:
    """(``frames``, each observation's frame ids ``obs_ids`` as positions into ``frames``,
    whose ids are ``ids``)."""
    order = np.argsort(ids)
    pos = order[np.minimum(np.searchsorted(ids[order], obs_ids), len(ids) - 1)]
    if not np.array_equal(ids[pos], obs_ids):  # a frame the rollout never emitted: a bug, not bad input
        raise RuntimeError(f"actor {actor_id}: a rollout refers to frames it does not carry")
    return frames, pos.astype(np.int32)
