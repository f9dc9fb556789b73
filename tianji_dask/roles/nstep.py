"""n-step transitions from a vector env, computed in the actor (as Ape-X does).

For each env the last ``n`` steps are kept; once the window is full, every step
emits the transition that starts at the window's oldest step::

    (obs_t, a_t, R = sum_{j<=k} gamma^j r_{t+j}, next_obs = s'_{t+k}, discount = gamma^(k+1) * (1 - terminated_{t+k}))

where ``k`` is the first step of the window whose episode ended (else ``n - 1``). A
transition never crosses an episode boundary; truncated episodes bootstrap from their
final observation. With ``n = 1`` this is the ordinary one-step transition.
"""

from __future__ import annotations

import numpy as np


class NStepWindow:
    """``add(obs, actions, rewards, next_obs, terminated, done)`` per vector step; returns the
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
