"""The PPO actor role: collects fixed-length rollouts with one policy version each.

Like :class:`~tianji_dask.algos.dqn.actor.DQNActorRole` it pushes into ``sender`` and probes
``params``, but it swaps parameters only between rollouts, so every rollout is tagged
with exactly the version that produced it (the learner measures staleness from it).

Each step is a row of its :class:`~tianji_dask.algos.ppo.rollout_writer.RolloutWriter`. Atari
(``env.kind: atari``): a rollout carries each 84x84 frame once and its observations as positions
into them, a quarter of the bytes of the stacks; the learner rebuilds the stacks
(``frames[obs_frames]``) on its device.

``Box`` action spaces (:mod:`tianji_dask.algos.ppo.gaussian`): the rollout carries the actions
as sampled (``(T, N, action_dim)`` float32; the env gets them clipped to its bounds), the
observations and rewards as normalised with the statistics of the rollout's parameter version,
and the moments of the raw observations and discounted returns it saw (``obs_moments``,
``return_moments``), which the learner folds into its statistics.

Choosing ahead: with envs that step in two calls (ale-py's ``send``/``recv``:
:meth:`~tianji_dask.envs.EnvGroups.send_all`, :meth:`~tianji_dask.envs.EnvGroups.recv_all`), the
actor sends each group the next step's actions as soon as it has received the group's step, and
does the step's bookkeeping (frame streams, training signals, episodes, the rollout's arrays)
while the emulators run the next one. A rollout's first actions are chosen only after the
parameters are probed, so it stays one version's, and the rollouts are those of choosing after
the bookkeeping (tests/test_env_groups.py). A policy whose next choice depends on that
bookkeeping (the Gaussian one: its observation statistics and gSDE draws) sets
``chooses_ahead = False``. An actor closed with a step in flight receives it first.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from tianji_dask.algos.ppo.core import acting_policy
from tianji_dask.algos.ppo.pacing import RolloutCredit, rollouts_per_version
from tianji_dask.algos.ppo.rollout_writer import RolloutWriter
from tianji_dask.roles.actor_base import ActorBase

if TYPE_CHECKING:
    from tianji_dask.config.schema import PPOConfig


class PPOActorRole(ActorBase):
    """Protocol as DQNActorRole: ``wait_for_params()``, then ``step()`` in a loop; ``heartbeat()``."""

    algo: PPOConfig

    def _setup(self, seed: int) -> None:
        cfg = self.cfg
        self.policy = acting_policy(cfg, self.action_space, self.obs_dim, seed)
        # uint8 frame stacks for Atari (rollouts move as uint8); the policy's view of them in obs
        self.raw_obs = self.reset_env(seed)
        self.obs = self.policy.normalize(self.raw_obs)
        self.T = self.algo.rollout_steps
        self.learner_consumed = 0
        self.credit = RolloutCredit(self._rollouts_per_version(), self.algo.rollouts_ahead)
        self.writer = RolloutWriter(
            self.id,
            self.T,
            self.num_envs,
            self.obs_shape,
            self.obs_dtype,
            self.policy.action_shape,
            self.policy.action_dtype,
            cfg.env.frame_stacks,
        )
        # envs that step in two calls get the next step's actions before this step's bookkeeping,
        # so the emulators run while it is done; the actions of a rollout's first step are chosen
        # after the parameters are probed, so a rollout stays one version's
        self.chooses_ahead = self.env.overlaps and self.policy.chooses_ahead
        self._next_choice: tuple[np.ndarray, ...] | None = None  # chosen and sent, not yet received
        self.writer.begin(self.obs)

    def _rollouts_per_version(self) -> int:
        algo, learners = self.algo, self.cfg.topology.learners
        tol = algo.ratio_tolerance or 0.0
        return rollouts_per_version(algo.rollouts_per_update, learners, self.n_actors, algo.sample_reuse, tol)

    def ahead_of_learner(self) -> bool:
        """Balance controller: has this actor made the rollouts the learner's versions so far
        allow (:mod:`tianji_dask.algos.ppo.pacing`)?"""
        return self.credit.exhausted

    def _on_new_version(self) -> None:
        self.credit.new_version(self.policy.version, self.dropped_by_learner())
        # versions change between rollouts only: the whole next rollout sees this one's normalisation
        self.obs = self.policy.normalize(self.raw_obs)

    def step(self) -> bool:
        if self.writer.rows == 0:  # between rollouts: newest parameters, and the controller's say
            self.probe_params()
            if self.balance and self.ahead_of_learner():
                return self.throttle()
        self.policy.exploration_step(self.writer.rows)
        (_, actions, logp, values), (next_obs, rewards, terminated, truncated, infos) = self._act_and_step()
        next_obs = next_obs.astype(self.obs_dtype, copy=False)
        ended = terminated | truncated
        self.tracker.update(rewards, ended, time.time())  # the env's own rewards
        train_rewards, dones = self._training_signals(rewards, terminated, truncated, infos)
        full = self.writer.add(self.obs, next_obs, ended, infos, actions, logp, values, train_rewards, dones)
        self.raw_obs = next_obs
        self.obs = self.policy.observe(next_obs)
        self.counters.env_steps += self.num_envs
        if full:
            self.flush()
        return True

    def _act_and_step(self) -> tuple[tuple[np.ndarray, ...], tuple]:
        """(the choice, as ``_choose`` returns it; the env's step result) for the current observations."""
        if not self.chooses_ahead:  # each group of envs steps while the policy acts for the next group
            return self.env.step_with(self._choose, self.obs)
        choice = self._next_choice if self._next_choice is not None else self.env.send_all(self._choose, self.obs)
        last_row = self.writer.rows + 1 == self.T  # the next rollout's first actions wait for its parameters
        result, self._next_choice = self.env.recv_all(None if last_row else self._choose)
        return choice, result

    def _training_signals(self, rewards, terminated, truncated, infos) -> tuple[np.ndarray, np.ndarray]:
        """(rewards, dones) the learner trains on: Atari clips rewards and ends an episode at each
        lost life; a time limit is not a terminal state, so its reward bootstraps from the final
        observation."""
        rewards, terminated, dones = self.training_signals(rewards, terminated, truncated, infos)
        rewards = self.policy.training_rewards(rewards.astype(np.float32), terminated)
        only_truncated = truncated & ~terminated
        if only_truncated.any():
            final: np.ndarray = np.stack([infos["final_obs"][i] for i in np.flatnonzero(only_truncated)]).astype(
                self.obs_dtype
            )
            rewards[only_truncated] += self.algo.gamma * self.policy.value(self.policy.normalize(final))
        return rewards, dones

    def _choose(self, group: int, obs: np.ndarray | None) -> tuple[np.ndarray, ...]:
        """(what the env gets, the actions the rollout keeps, their log-probs, values)."""
        assert obs is not None  # step() passes the observations
        actions, logp, values = self.policy.act(obs, self.env.envs_of(group))
        return self.policy.env_actions(actions), actions, logp, values

    def unsent(self) -> int:
        return self.writer.rows * self.num_envs

    def flush(self) -> None:
        """Push the finished rollout, tagged with its policy version and creation time."""
        if not self.writer.full:
            return  # PPO trains on whole rollouts only
        r = self.writer.take()
        r["last_values"] = self.policy.value(self.obs)
        r.update(self.policy.rollout_statistics())
        r["version"] = np.array(self.policy.version, np.int64)
        r["created"] = np.array(time.time(), np.float64)
        r["actor"] = np.array(self.id, np.int64)
        self.credit.spend()
        self.push(r)
        self.writer.begin(self.obs)
        if self.synchronous:
            self.wait_for_newer_params()
