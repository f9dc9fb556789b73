"""The PPO actor role: collects fixed-length rollouts with one policy version each.

Like :class:`~tianji_dask.algos.dqn.actor.DQNActorRole` it pushes into ``sender`` and probes
``params``, but it swaps parameters only between rollouts, so every rollout is tagged
with exactly the version that produced it (the learner measures staleness from it).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from tianji_dask.algos.networks import network_kind
from tianji_dask.algos.ppo.core import PPOPolicy
from tianji_dask.roles.actor_base import ActorBase

if TYPE_CHECKING:
    from tianji_dask.config.schema import PPOConfig


class PPOActorRole(ActorBase):
    """Protocol as DQNActorRole: ``wait_for_params()``, then ``step()`` in a loop; ``heartbeat()``."""

    algo: PPOConfig

    def _setup(self, seed: int) -> None:
        cfg = self.cfg
        self.policy = PPOPolicy(self.obs_dim, self.n_actions, self.algo.hidden_sizes, seed, network=network_kind(cfg))
        self.obs = self.reset_env(seed)  # uint8 frame stacks for Atari (rollouts move as uint8)
        self.T = self.algo.rollout_steps
        self.learner_consumed = 0
        algo, topo = self.algo, cfg.topology
        share = algo.rollouts_per_update * topo.learners / (self.n_actors * algo.sample_reuse)
        # its share of a version within the band, plus the one rollout it makes while the
        # learner trains on the previous one (without it actor and learner would alternate)
        self.quota = max(1, int(share * (1.0 + (algo.ratio_tolerance or 0.0)))) + 1
        self._rollouts_this_version = 0
        self._t = 0
        self._new_rollout()

    def _new_rollout(self) -> None:
        T, N = self.T, self.num_envs
        self._r: dict[str, np.ndarray] = {
            "obs": np.empty((T, N, *self.obs_shape), self.obs_dtype),
            "actions": np.empty((T, N), np.int64),
            "logp": np.empty((T, N), np.float32),
            "values": np.empty((T, N), np.float32),
            "rewards": np.empty((T, N), np.float32),
            "dones": np.empty((T, N), np.float32),
        }
        self._t = 0

    def ahead_of_learner(self) -> bool:
        """Balance controller: has this actor produced its share of rollouts for the current
        parameter version?

        A learner iteration takes ``rollouts_per_update`` rollouts per learner and may use each
        ``sample_reuse`` times, so a version needs ``rollouts_per_update * learners /
        (actors * sample_reuse)`` new rollouts from each actor; the band allows
        ``1 + ratio_tolerance`` times that, rounded down, never less than one, plus the rollout
        made while the learner trains on the previous one. It paces on
        versions, not on a consumption count: rollouts that go stale and are dropped would never
        be counted as consumed, and both sides could end up waiting for each other."""
        return self._rollouts_this_version >= self.quota

    def _on_new_version(self) -> None:
        self._rollouts_this_version = 0

    def step(self) -> bool:
        if self._t == 0:  # between rollouts: newest parameters, and the controller's say
            self.probe_params()
            if self.balance and self.ahead_of_learner():
                t = time.perf_counter()
                time.sleep(0.002)
                self.counters.throttled_s += time.perf_counter() - t
                return False
        actions, logp, values = self.policy.act(self.obs)
        next_obs, rewards, terminated, truncated, infos = self.env.step(actions)
        next_obs = next_obs.astype(self.obs_dtype, copy=False)
        self.tracker.update(rewards, terminated | truncated, time.time())  # the env's own rewards
        # Atari trains on clipped rewards and ends an episode at each lost life
        rewards, terminated, dones = self.training_signals(rewards, terminated, truncated, infos)
        rewards = rewards.astype(np.float32)
        only_truncated = truncated & ~terminated
        if only_truncated.any():  # a time limit is not a terminal state: bootstrap from the final obs
            final: np.ndarray = np.stack([infos["final_obs"][i] for i in np.flatnonzero(only_truncated)]).astype(
                self.obs_dtype
            )
            rewards[only_truncated] += self.algo.gamma * self.policy.value(final)
        r, t = self._r, self._t
        r["obs"][t], r["actions"][t], r["logp"][t], r["values"][t] = self.obs, actions, logp, values
        r["rewards"][t], r["dones"][t] = rewards, dones
        self.obs = next_obs
        self._t += 1
        self.counters.env_steps += self.num_envs
        if self._t == self.T:
            self.flush()
        return True

    def flush(self) -> None:
        """Push the finished rollout, tagged with its policy version and creation time."""
        if self._t < self.T:
            return  # PPO trains on whole rollouts only
        r = self._r
        r["last_values"] = self.policy.value(self.obs)
        r["version"] = np.array(self.policy.version, np.int64)
        r["created"] = np.array(time.time(), np.float64)
        nbytes = sum(v.nbytes for v in r.values())
        self._rollouts_this_version += 1
        if self.sender.push(r):
            self.counters.messages_sent += 1
            self.counters.bytes_sent += nbytes
        self._new_rollout()
        if self.synchronous:
            self.wait_for_newer_params()
