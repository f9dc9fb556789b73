"""The DQN actor role: policy inference + simulation (steps 1 and 2 of the paper's Algorithm 1),
and what it writes: :class:`TransitionWriter` packs env steps into chunks of n-step transitions
(made by :class:`NStepWindow`), the payload the buffer receives.

Transport-agnostic: it pushes trajectory chunks into ``sender`` (anything with
``push(dict) -> bool``) and probes ``params`` (anything with ``probe()``) for a
newer policy version. The same class runs inside an :class:`~tianji_dask.runtime.hosts.hosts.ActorHost`
thread and in the serial runner.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from tianji_dask.algos.dqn.core import DQNPolicy, ape_x_epsilons, epsilon_at
from tianji_dask.algos.dqn.priorities import ActorPriorities
from tianji_dask.algos.networks import network_kind
from tianji_dask.config.schema import DQNConfig
from tianji_dask.envs import action_count, next_observations
from tianji_dask.roles.actor_base import ActorBase
from tianji_dask.roles.frame_replay import FrameStreams
from tianji_dask.roles.heartbeats import ActorCounters, counter

if TYPE_CHECKING:
    from tianji_dask.config.schema import ExperimentConfig


@dataclass
class DQNActorCounters(ActorCounters):
    epsilon: float = counter(1.0)  # exploration rate in use (the mean over the envs with per-env epsilons)


class DQNActorRole(ActorBase):
    """One actor: ``step()`` advances all its envs by one step.

    Protocol: construct, ``wait_for_params()`` once (or load params yourself),
    then call ``step()`` in a loop; ``heartbeat()`` returns cumulative counters.
    ``flush()`` pushes a partial chunk (the serial runner uses it).

    Atari (``env.kind: atari``): chunks carry each new 84x84 frame once (``frames``,
    ``frame_ids``) and the transitions' ``obs``/``next_obs`` as 4-frame id stacks
    (:mod:`tianji_dask.roles.frame_replay`); the n-step window runs on those ids.
    """

    algo: DQNConfig

    counters_class = DQNActorCounters
    counters: DQNActorCounters

    def _setup(self, seed: int) -> None:
        cfg, algo = self.cfg, self.algo
        self.policy = DQNPolicy(
            self.obs_dim,
            action_count(self.action_space),
            algo.hidden_sizes,
            seed,
            network=network_kind(cfg),
            device=cfg.actor.device,
            dueling=algo.dueling,
        )
        self.obs = self.reset_env(seed)
        self.writer = TransitionWriter(cfg, self.id, self.obs_shape, self.obs_dtype, self.obs)
        self.learner_consumed = 0
        self._env_eps: np.ndarray | None = None  # exploration: per_env, fixed for the run
        if algo.exploration == "per_env":
            total = cfg.topology.groups * self.n_actors * self.num_envs
            first = self.id * self.num_envs  # actor ids are global: group * actors + i
            self._env_eps = ape_x_epsilons(first, self.num_envs, total, algo.per_env_eps_base, algo.per_env_eps_alpha)

    def ahead_of_learner(self) -> bool:
        """Production/consumption balance: is this actor's share of production ahead of
        what the learner's consumption allows at the serial replay ratio (minus the band)?"""
        algo = self.algo
        if algo.ratio_tolerance is None:  # the controller is off
            return False
        # every learner's buffer must fill to learning_starts before its group can update
        allowed = (
            algo.learning_starts * self.cfg.topology.learners
            + self.writer.chunk_len * self.n_actors
            + self.learner_consumed / (algo.target_replay_ratio * (1.0 - algo.ratio_tolerance))
        )
        return self.balanced_env_steps * self.n_actors > allowed

    def _epsilon(self) -> np.ndarray | float:
        """The exploration rate of each env (per_env) or of all (annealed over every actor's steps)."""
        if self._env_eps is not None:
            return self._env_eps
        algo = self.algo
        return epsilon_at(
            self.produced_env_steps * self.n_actors,
            algo.exploration_initial_eps,
            algo.exploration_final_eps,
            algo.exploration_steps,
        )

    def step(self) -> bool:
        self.probe_params()
        if self.balance and self.ahead_of_learner():
            self.flush()  # the learner must see everything produced, or both sides could wait forever
            return self.throttle()
        eps = self._epsilon()
        q = None
        if self.writer.prioritized:
            actions, q = self.policy.act_and_values(self.obs, eps)
        else:
            actions = self.policy.act(self.obs, eps)
        next_obs, rewards, terminated, truncated, infos = self.env.step(actions)
        next_obs = next_obs.astype(self.obs_dtype, copy=False)
        ended = terminated | truncated
        signals = self.training_signals(rewards, terminated, truncated, infos)
        full = self.writer.add(self.obs, actions, q, next_obs, ended, infos, *signals)
        self.tracker.update(rewards, ended, time.time())
        self.obs = next_obs
        self.counters.env_steps += self.num_envs
        self.counters.epsilon = float(np.mean(eps))
        if full:
            self.flush()
        return True

    def unsent(self) -> int:
        return self.writer.unsent

    def flush(self) -> None:
        """Push the current chunk (possibly partial); a new one begins."""
        chunk = self.writer.take(lambda: self.policy.q_values(self.obs).max(axis=1))
        if chunk is None:
            return
        self.push(chunk)
        if self.synchronous and self.balanced_env_steps * self.n_actors >= (
            self.algo.learning_starts * self.cfg.topology.learners
        ):
            self.wait_for_newer_params()


# ---------------------------------------------------------------------------- the writer
class TransitionWriter:
    """The DQN actor's outgoing data: env steps in, chunks of n-step transitions out.

    Each env step goes through the n-step window; the transitions it emits fill a chunk of
    ``channel.chunk_steps x num_envs`` rows. Atari (``env.kind: atari``): the transitions'
    ``obs``/``next_obs`` are 4-frame id stacks (:mod:`tianji_dask.roles.frame_replay`) and a chunk
    carries each new 84x84 frame once (``frames``, ``frame_ids``). Prioritized replay: each
    transition's initial priority (:mod:`tianji_dask.algos.dqn.priorities`) is completed once the
    action values it bootstraps from are known.

    ``add()`` each env step; ``take()`` the chunk so far (``add`` says when it is full)."""

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


class NStepWindow:
    """Transitions for off-policy learners: how actors make them and where buffers keep them.

    :class:`NStepWindow` makes n-step transitions from a vector env, in the actor (as Ape-X does).
    For each env the last ``n`` steps are kept; once the window is full, every step emits the
    transition that starts at the window's oldest step::

        (obs_t, a_t, R = sum_{j<=k} gamma^j r_{t+j}, next_obs = s'_{t+k},
         discount = gamma^(k+1) * (1 - terminated_{t+k}))

    where ``k`` is the first step of the window whose episode ended (else ``n - 1``). A
    transition never crosses an episode boundary; truncated episodes bootstrap from their
    final observation. With ``n = 1`` this is the ordinary one-step transition.

    ``add(obs, actions, rewards, next_obs, terminated, done)`` per vector step; returns the
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
