"""The actor role: policy inference + simulation (steps 1 and 2 of the paper's Algorithm 1).

Transport-agnostic: it pushes trajectory chunks into ``sender`` (anything with
``push(dict) -> bool``) and probes ``params`` (anything with ``probe()``) for a
newer policy version. The same class runs inside an :class:`~tianji_dask.runtime.hosts.hosts.ActorHost`
thread and in the serial runner.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tianji_dask.algos.dqn.core import DQNPolicy, ape_x_epsilons, epsilon_at
from tianji_dask.algos.dqn.transition_writer import TransitionWriter
from tianji_dask.algos.networks import network_kind
from tianji_dask.envs import action_count
from tianji_dask.roles.actor_base import ActorBase
from tianji_dask.roles.heartbeats import ActorCounters, counter

if TYPE_CHECKING:
    from tianji_dask.config.schema import DQNConfig


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
