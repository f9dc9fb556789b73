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

import numpy as np

from tianji_dask.algos.ppo import PPOLearner, gae


class PPOLearnerRole:
    """Protocol as LearnerRole: ``publish()`` once, then ``step()`` in a loop; ``heartbeat()``."""

    def __init__(self, cfg, buffer, publisher, obs_dim: int, n_actions: int, seed: int,
                 *, balance: bool = True, learner_id: int = 0, grad_hook=None):
        self.cfg = cfg
        self.id = learner_id
        self.buffer = buffer
        self.publisher = publisher
        self.core = PPOLearner(obs_dim, n_actions, cfg.algo, seed, cfg.learner.device)
        self.grad_hook = grad_hook
        self.version = 0
        self._stats: dict[str, float] = {}
        self._n = 0
        self._lags: list[int] = []
        self._ages: list[float] = []
        self.counters = {"updates": 0, "samples": 0, "param_version": -1, "throttled_s": 0.0,
                         "iterations": 0}

    def publish(self) -> None:
        self.publisher.publish(self.version, {"params": self.core.actor_params(),
                                              "consumed": self.counters["samples"]})
        self.counters["param_version"] = self.version

    def ready(self) -> bool:
        return True

    def batch_from(self, rollouts) -> dict[str, np.ndarray]:
        a = self.cfg.algo
        parts = {k: [] for k in ("obs", "actions", "logp", "advantages", "returns")}
        for r in rollouts:
            d = r.data
            adv, ret = gae(d["rewards"], d["values"], d["dones"], d["last_values"], a.gamma, a.gae_lambda)
            obs = d["obs"]
            parts["obs"].append(obs.reshape(-1, *obs.shape[2:]))
            parts["actions"].append(d["actions"].reshape(-1))
            parts["logp"].append(d["logp"].reshape(-1))
            parts["advantages"].append(adv.reshape(-1))
            parts["returns"].append(ret.reshape(-1))
        return {k: np.concatenate(v) if len(v) > 1 else v[0] for k, v in parts.items()}

    def step(self) -> bool:
        rollouts = self.buffer.take(self.version)
        if not rollouts:
            return False
        now = time.time()
        self._lags += [self.version - r.version for r in rollouts]
        self._ages += [now - r.created for r in rollouts]
        batch = self.batch_from(rollouts)
        self.core.set_lr_for(self.buffer.received)
        before = self.core.updates
        stats = self.core.train(batch, self.grad_hook)
        for k, v in stats.items():
            self._stats[k] = self._stats.get(k, 0.0) + v
        self._n += 1
        self.version += 1
        self.counters["iterations"] += 1
        self.counters["updates"] += self.core.updates - before
        self.counters["samples"] += len(batch["actions"])
        self.publish()
        return True

    def heartbeat(self) -> dict:
        c = dict(self.counters)
        n = self._n
        c["loss"] = self._stats.get("loss", math.nan) / n if n else math.nan
        c["q_mean"] = math.nan
        for k in ("approx_kl", "entropy", "clipfrac"):
            c[k] = self._stats.get(k, math.nan) / n if n else math.nan
        c["policy_lag_mean"] = float(np.mean(self._lags)) if self._lags else math.nan
        c["policy_lag_max"] = float(max(self._lags)) if self._lags else math.nan
        c["sample_age_s"] = float(np.mean(self._ages)) if self._ages else math.nan
        self._stats, self._n, self._lags, self._ages = {}, 0, [], []
        return {"role": "learner", "id": self.id, "t": time.time(), "counters": c, "episodes": []}
