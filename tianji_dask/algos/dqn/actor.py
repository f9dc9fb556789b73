"""The actor role: policy inference + simulation (steps 1 and 2 of the paper's Algorithm 1).

Transport-agnostic: it pushes trajectory chunks into ``sender`` (anything with
``push(dict) -> bool``) and probes ``params`` (anything with ``probe()``) for a
newer policy version. The same class runs inside an :class:`~tianji_dask.runtime.hosts.ActorHost`
thread and in the serial runner.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tianji_dask.algos.dqn.core import DQNPolicy, ape_x_epsilons, epsilon_at
from tianji_dask.algos.dqn.priorities import ActorPriorities
from tianji_dask.algos.networks import network_kind
from tianji_dask.envs import action_count, next_observations
from tianji_dask.roles.actor_base import ActorBase
from tianji_dask.roles.frame_replay import FrameStreams
from tianji_dask.roles.heartbeats import ActorCounters, counter
from tianji_dask.roles.replay import NStepWindow

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
        cfg = self.cfg
        self.policy = DQNPolicy(
            self.obs_dim,
            action_count(self.action_space),
            self.algo.hidden_sizes,
            seed,
            network=network_kind(cfg),
            device=cfg.actor.device,
            dueling=self.algo.dueling,
        )
        self.obs = self.reset_env(seed)
        self.frames = None
        # what transitions carry as observations: the observations, or Atari's frame-id stacks
        self._tr_shape, self._tr_dtype = self.obs_shape, self.obs_dtype
        if cfg.env.frame_stacks:
            self.frames = FrameStreams(self.id, self.num_envs, stack=self.obs_shape[0])
            self.frames.start(self.obs)
            self._tr_shape, self._tr_dtype = (self.obs_shape[0],), np.int64
        self.window = NStepWindow(self.algo.n_step, self.algo.gamma, self.num_envs, self._tr_shape, self._tr_dtype)
        self.priorities = (
            ActorPriorities(self.algo.n_step, self.num_envs) if self.algo.replay == "prioritized" else None
        )
        self.chunk_len = cfg.channel.chunk_steps * self.num_envs
        self._new_chunk()
        self.learner_consumed = 0
        algo = self.algo
        self._env_eps: np.ndarray | None = None  # exploration: per_env, fixed for the run
        if algo.exploration == "per_env":
            total = self.cfg.topology.groups * self.n_actors * self.num_envs
            first = self.id * self.num_envs  # actor ids are global: group * actors + i
            self._env_eps = ape_x_epsilons(first, self.num_envs, total, algo.per_env_eps_base, algo.per_env_eps_alpha)

    def _new_chunk(self) -> None:
        n = self.chunk_len
        self._chunk: dict[str, np.ndarray] = {
            "obs": np.empty((n, *self._tr_shape), self._tr_dtype),
            "next_obs": np.empty((n, *self._tr_shape), self._tr_dtype),
            "actions": np.empty(n, np.int64),
            "rewards": np.empty(n, np.float32),
            "discounts": np.empty(n, np.float32),
        }
        if self.priorities is not None:
            self._chunk["priorities"] = np.empty(n, np.float32)
        self._fill = 0

    def ahead_of_learner(self) -> bool:
        """Production/consumption balance: is this actor's share of production ahead of
        what the learner's consumption allows at the serial replay ratio (minus the band)?"""
        algo = self.algo
        if algo.ratio_tolerance is None:  # the controller is off
            return False
        # every learner's buffer must fill to learning_starts before its group can update
        allowed = (
            algo.learning_starts * self.cfg.topology.learners
            + self.chunk_len * self.n_actors
            + self.learner_consumed / (algo.target_replay_ratio * (1.0 - algo.ratio_tolerance))
        )
        return self.balanced_env_steps * self.n_actors > allowed

    def step(self) -> bool:
        self.probe_params()
        if self.balance and self.ahead_of_learner():
            t = time.perf_counter()
            self.flush()  # the learner must see everything produced, or both sides could wait forever
            time.sleep(0.002)
            self.counters.throttled_s += time.perf_counter() - t
            return False
        algo = self.algo
        eps = (
            epsilon_at(
                self.produced_env_steps * self.n_actors,
                algo.exploration_initial_eps,
                algo.exploration_final_eps,
                algo.exploration_steps,
            )
            if self._env_eps is None
            else self._env_eps
        )
        if self.priorities is None:
            actions = self.policy.act(self.obs, eps)
        else:
            actions, q = self.policy.act_and_values(self.obs, eps)
            self.priorities.complete(self._chunk["priorities"], q.max(axis=1))
        next_obs, rewards, terminated, truncated, infos = self.env.step(actions)
        dones = terminated | truncated
        next_obs = next_obs.astype(self.obs_dtype, copy=False)
        train_rewards, train_terminated, train_dones = self.training_signals(rewards, terminated, truncated, infos)
        if self.frames is None:
            real_next = next_observations(next_obs, dones, infos)
            out = self.window.add(self.obs, actions, train_rewards, real_next, train_terminated, train_dones)
        else:
            ids = self.frames.ids
            real_next = self.frames.step(next_obs, dones, infos)
            out = self.window.add(ids, actions, train_rewards, real_next, train_terminated, train_dones)
        if self.priorities is not None:
            self.priorities.record(q[np.arange(self.num_envs), actions], train_dones)
        self.tracker.update(rewards, dones, time.time())
        self.obs = next_obs
        self.counters.env_steps += self.num_envs
        self.counters.epsilon = float(np.mean(eps))
        if out is not None:
            i, n = self._fill, self.num_envs
            for k, v in out.items():
                self._chunk[k][i : i + n] = v
            if self.priorities is not None:
                self.priorities.emitted(out, self._chunk["priorities"], i)
            self._fill += n
            if self._fill >= self.chunk_len:
                self.flush()
        return True

    def unsent(self) -> int:
        return self._fill

    def flush(self) -> None:
        """Push the current chunk (possibly partial) and start a new one."""
        if self._fill == 0:
            return
        if self.priorities is not None and self.priorities.pending:
            self.priorities.complete(self._chunk["priorities"], self.policy.q_values(self.obs).max(axis=1))
        chunk = {k: v[: self._fill] for k, v in self._chunk.items()}
        if self.frames is not None:  # every frame emitted so far: this chunk's stacks end there
            chunk["frames"], chunk["frame_ids"] = self.frames.take()
        nbytes = sum(v.nbytes for v in chunk.values())
        if self.sender.push(chunk):
            self.counters.messages_sent += 1
            self.counters.bytes_sent += nbytes
        self._new_chunk()  # the pushed arrays now belong to the channel
        if self.synchronous and self.balanced_env_steps * self.n_actors >= (
            self.algo.learning_starts * self.cfg.topology.learners
        ):
            self.wait_for_newer_params()
