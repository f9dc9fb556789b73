"""The PPO learner role: one iteration = GAE on the freshest rollouts, then minibatch epochs.

It never waits for fresh data beyond what the sample distribution allows: when the
buffer has no rollout within ``max_policy_lag`` that was used fewer than
``sample_reuse`` times, ``step()`` returns False. Each iteration publishes a new
version (versions count iterations). It records the staleness of what it trained on:
policy lag in versions (mean and max) and sample age in seconds.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import gymnasium as gym
import numpy as np

from tianji_dask.algos.ppo.core import PPOLearner, gae, network_for
from tianji_dask.roles.heartbeats import Heartbeat, LearnerCounters, counter
from tianji_dask.roles.learner_base import LearnerBase

if TYPE_CHECKING:
    from tianji_dask.config.schema import PPOConfig


@dataclass
class PPOLearnerCounters(LearnerCounters):
    iterations: int = counter()  # training iterations: one batch of rollouts each
    # means since the previous heartbeat
    approx_kl: float = counter(math.nan)
    entropy: float = counter(math.nan)
    clipfrac: float = counter(math.nan)
    behaviour_weight: float = counter(math.nan)  # decoupled PPO's pi_prox / pi_acted weight (1 without it)
    policy_lag_mean: float = counter(math.nan)  # versions between a rollout's policy and the learner's
    policy_lag_max: float = counter(math.nan)
    sample_age_s: float = counter(math.nan)  # training time minus a rollout's creation time


class PPOLearnerRole(LearnerBase):
    """``publish()`` once, then ``step()`` in a loop; ``heartbeat()``."""

    algo: PPOConfig

    learner_core: PPOLearner
    counters_class = PPOLearnerCounters
    counters: PPOLearnerCounters

    def _make_learner_core(self, obs_dim: int, action_space: gym.Space, seed: int) -> PPOLearner:
        cfg = self.cfg
        network, outputs = network_for(cfg, action_space)
        return PPOLearner(obs_dim, outputs, self.algo, seed, cfg.learner.device, network=network)

    def _setup(self) -> None:
        # env steps one iteration stands for in the serial algorithm (a rollout per reuse)
        cfg, algo = self.cfg, self.algo
        self._env_steps_per_iteration = (
            algo.rollouts_per_update * algo.rollout_steps * cfg.env.num_envs * self.world_size / algo.sample_reuse
        )
        self.version = 0
        self._prior_iterations = 0  # iterations of the learner state restored, if any
        self._pending = None  # rollouts taken by wants_update, trained on by update
        self._stats: dict[str, float] = {}
        self._n = 0
        self._lags: list[int] = []
        self._ages: list[float] = []

    def publish(self) -> None:
        """The version, with the rollouts its buffer dropped unused per actor, which the actors'
        balance controller refunds (:mod:`tianji_dask.algos.ppo.pacing`; in a data-parallel group
        rank 0 publishes its own buffer's)."""
        self._publish_version(self.version, self.buffer.dropped_by_actor())

    def ready(self) -> bool:
        return True

    def wants_update(self) -> bool:
        """Takes the next batch's rollouts now (kept until :meth:`update`), so a data-parallel
        rank that agreed to update always has data for the same number of all-reduces."""
        if self._pending is None:
            self._pending = self.buffer.take(self.version) or None
        return self._pending is not None

    def update(self) -> None:
        rollouts, self._pending = self._pending, None
        t = time.perf_counter()
        self._train_on(rollouts)
        self.counters.train_s += time.perf_counter() - t

    def batch_from(self, rollouts) -> dict[str, np.ndarray]:
        """One flat batch of the rollouts; Atari rollouts' ``frames`` are concatenated and their
        ``obs_frames`` positions shifted to match (:meth:`PPOLearner.train` rebuilds the stacks)."""
        algo = self.algo
        fields: tuple[str, ...] = ("actions", "logp", "advantages", "returns")
        fields += ("frames", "obs_frames") if "frames" in rollouts[0].data else ("obs",)
        parts: dict[str, list[np.ndarray]] = {k: [] for k in fields}
        n_frames = 0
        for r in rollouts:
            d = r.data
            adv, ret = gae(d["rewards"], d["values"], d["dones"], d["last_values"], algo.gamma, algo.gae_lambda)
            if "frames" in d:
                parts["frames"].append(d["frames"])
                positions = d["obs_frames"]
                parts["obs_frames"].append(positions.reshape(-1, positions.shape[-1]) + n_frames)
                n_frames += len(d["frames"])
            else:
                obs = d["obs"]
                parts["obs"].append(obs.reshape(-1, *obs.shape[2:]))
            actions = d["actions"]  # (T, N), or (T, N, action_dim) for a Box action space
            parts["actions"].append(actions.reshape(-1, *actions.shape[2:]))
            parts["logp"].append(d["logp"].reshape(-1))
            parts["advantages"].append(adv.reshape(-1))
            parts["returns"].append(ret.reshape(-1))
        return {k: np.concatenate(v) if len(v) > 1 else v[0] for k, v in parts.items()}

    def step(self) -> bool:
        if not self.wants_update():
            return False
        self.update()
        return True

    def _train_on(self, rollouts) -> None:
        now = time.time()
        self._lags += [self.version - r.version for r in rollouts]
        self._ages += [now - r.created for r in rollouts]
        for r in rollouts:
            if r.uses == 1:  # a rollout's statistics count once, however often it is trained on
                self.learner_core.merge_statistics(r.data)
        batch = self.batch_from(rollouts)
        # the lr schedule follows what the learner trained on, as in the serial algorithm, not what
        # the actors produced: with actors faster than the learner most rollouts are dropped
        # unused, and annealing on received transitions reached the lr floor within a few dozen
        # iterations (identical on every data-parallel rank: iterations advance together)
        iterations = self._prior_iterations + self.counters.iterations
        self.learner_core.set_lr_for(int(iterations * self._env_steps_per_iteration))
        before = self.learner_core.updates
        stats = self.learner_core.train(batch, self.grad_hook)
        for k, v in stats.items():
            self._stats[k] = self._stats.get(k, 0.0) + v
        self._n += 1
        self.version += 1
        self.counters.iterations += 1
        self.counters.updates += self.learner_core.updates - before
        self.counters.samples += len(batch["actions"])
        self.publish()

    def restore(self, state) -> None:
        """Continue from a saved state; the learning-rate schedule goes on from the iterations it
        had trained (its update count holds epochs x minibatches per iteration)."""
        super().restore(state)
        self._prior_iterations = self.learner_core.updates // (self.algo.epochs * self.algo.minibatches)

    def heartbeat(self) -> Heartbeat:
        c, n = self.counters, self._n
        c.loss = self._stats.get("loss", math.nan) / n if n else math.nan
        c.approx_kl = self._stats.get("approx_kl", math.nan) / n if n else math.nan
        c.entropy = self._stats.get("entropy", math.nan) / n if n else math.nan
        c.clipfrac = self._stats.get("clipfrac", math.nan) / n if n else math.nan
        c.behaviour_weight = self._stats.get("behaviour_weight", math.nan) / n if n else math.nan
        c.policy_lag_mean = float(np.mean(self._lags)) if self._lags else math.nan
        c.policy_lag_max = float(max(self._lags)) if self._lags else math.nan
        c.sample_age_s = float(np.mean(self._ages)) if self._ages else math.nan
        self._stats, self._n, self._lags, self._ages = {}, 0, [], []
        return Heartbeat("learner", self.id, c)
