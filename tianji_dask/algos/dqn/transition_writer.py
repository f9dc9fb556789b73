"""The DQN actor's outgoing data: env steps in, chunks of n-step transitions out.

Each env step goes through the n-step window; the transitions it emits fill a chunk of
``channel.chunk_steps x num_envs`` rows. Atari (``env.kind: atari``): the transitions'
``obs``/``next_obs`` are 4-frame id stacks (:mod:`tianji_dask.roles.frame_replay`) and a chunk
carries each new 84x84 frame once (``frames``, ``frame_ids``). Prioritized replay: each
transition's initial priority (:mod:`tianji_dask.algos.dqn.priorities`) is completed once the
action values it bootstraps from are known.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from tianji_dask.algos.dqn.priorities import ActorPriorities
from tianji_dask.config.schema import DQNConfig
from tianji_dask.envs import next_observations
from tianji_dask.roles.frame_replay import FrameStreams
from tianji_dask.roles.replay import NStepWindow

if TYPE_CHECKING:
    from tianji_dask.config.schema import ExperimentConfig


class TransitionWriter:
    """``add()`` each env step; ``take()`` the chunk so far (``add`` says when it is full)."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        actor_id: int,
        obs_shape: tuple[int, ...],
        obs_dtype: npt.DTypeLike,
        first_obs: np.ndarray,
    ):
        algo = cfg.algo_as(DQNConfig)
        self.num_envs = cfg.env.num_envs
        self.frames: FrameStreams | None = None
        # what transitions carry as observations: the observations, or Atari's frame-id stacks
        self._shape, self._dtype = obs_shape, obs_dtype
        if cfg.env.frame_stacks:
            self.frames = FrameStreams(actor_id, self.num_envs, stack=obs_shape[0])
            self.frames.start(first_obs)
            self._shape, self._dtype = (obs_shape[0],), np.int64
        self.window = NStepWindow(algo.n_step, algo.gamma, self.num_envs, self._shape, self._dtype)
        self.priorities = ActorPriorities(algo.n_step, self.num_envs) if algo.replay == "prioritized" else None
        self.chunk_len = cfg.channel.chunk_steps * self.num_envs
        self._new_chunk()

    @property
    def prioritized(self) -> bool:
        """Whether ``add`` needs the action values of the observations acted on."""
        return self.priorities is not None

    @property
    def unsent(self) -> int:
        """Transitions in the chunk, not yet taken."""
        return self._fill

    def _new_chunk(self) -> None:
        n = self.chunk_len
        self._chunk: dict[str, np.ndarray] = {
            "obs": np.empty((n, *self._shape), self._dtype),
            "next_obs": np.empty((n, *self._shape), self._dtype),
            "actions": np.empty(n, np.int64),
            "rewards": np.empty(n, np.float32),
            "discounts": np.empty(n, np.float32),
        }
        if self.priorities is not None:
            self._chunk["priorities"] = np.empty(n, np.float32)
        self._fill = 0

    def add(
        self,
        obs: np.ndarray,
        actions: np.ndarray,
        q: np.ndarray | None,
        next_obs: np.ndarray,
        ended: np.ndarray,
        infos: dict,
        rewards: np.ndarray,
        terminated: np.ndarray,
        dones: np.ndarray,
    ) -> bool:
        """One step of every env: ``obs`` acted on with ``actions`` (``q``: its action values,
        where ``prioritized``); the env's ``next_obs``, ``ended`` and ``infos``; the training
        signals ``rewards``, ``terminated`` and ``dones``. True when the chunk is full."""
        if self.priorities is not None:
            assert q is not None
            self.priorities.complete(self._chunk["priorities"], q.max(axis=1))
        if self.frames is None:
            real_next = next_observations(next_obs, ended, infos)
        else:
            obs = self.frames.ids
            real_next = self.frames.step(next_obs, ended, infos)
        out = self.window.add(obs, actions, rewards, real_next, terminated, dones)
        if self.priorities is not None:
            assert q is not None
            self.priorities.record(q[np.arange(self.num_envs), actions], dones)
        if out is not None:
            i, n = self._fill, self.num_envs
            for k, v in out.items():
                self._chunk[k][i : i + n] = v
            if self.priorities is not None:
                self.priorities.emitted(out, self._chunk["priorities"], i)
            self._fill += n
        return self._fill >= self.chunk_len

    def take(self, max_values: Callable[[], np.ndarray]) -> dict[str, np.ndarray] | None:
        """The chunk so far (None if it is empty); a new one begins and the taken arrays are the
        caller's. ``max_values()``: the greedy action values of the envs' current observations,
        for priorities that still wait for them."""
        if self._fill == 0:
            return None
        if self.priorities is not None and self.priorities.pending:
            self.priorities.complete(self._chunk["priorities"], max_values())
        chunk = {k: v[: self._fill] for k, v in self._chunk.items()}
        if self.frames is not None:  # every frame emitted so far: this chunk's stacks end there
            chunk["frames"], chunk["frame_ids"] = self.frames.take()
        self._new_chunk()
        return chunk
