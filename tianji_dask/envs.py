"""Vectorised gymnasium environments for actors.

Every actor steps ``num_envs`` copies of one environment in a ``SyncVectorEnv``
with same-step autoreset: when an episode ends, the returned observation is
already the first one of the next episode and the true last observation is in
``info["final_obs"]``. That keeps each step's (obs, action, reward, next_obs)
transition complete without a wasted reset step.
"""

from __future__ import annotations

import numpy as np
import gymnasium as gym


def make_vector_env(env_id: str, num_envs: int, seed: int) -> gym.vector.VectorEnv:
    """Build ``num_envs`` copies of ``env_id``, seeded ``seed, seed+1, ...`` on the first reset.

    Episode statistics (return and length of the full episode) are recorded by
    ``RecordEpisodeStatistics`` and reported by :class:`EpisodeTracker`.
    """
    env = gym.vector.SyncVectorEnv(
        [lambda: gym.make(env_id) for _ in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    env.reset(seed=seed)
    return env


class EpisodeTracker:
    """Accumulates per-env returns and lengths; hands out finished episodes.

    Call ``update(rewards, dones)`` after each vector step; ``drain()`` returns
    ``[[return, length, unix_time], ...]`` finished since the previous drain.
    """

    def __init__(self, num_envs: int):
        self._returns = np.zeros(num_envs, dtype=np.float64)
        self._lengths = np.zeros(num_envs, dtype=np.int64)
        self._finished: list[list[float]] = []
        self.count = 0

    def update(self, rewards: np.ndarray, dones: np.ndarray, now: float) -> None:
        self._returns += rewards
        self._lengths += 1
        if dones.any():
            for i in np.flatnonzero(dones):
                self._finished.append([float(self._returns[i]), int(self._lengths[i]), now])
            self.count += int(dones.sum())
            self._returns[dones] = 0.0
            self._lengths[dones] = 0

    def drain(self) -> list[list[float]]:
        out, self._finished = self._finished, []
        return out


def next_observations(obs: np.ndarray, dones: np.ndarray, infos: dict) -> np.ndarray:
    """The true next observation of each env: ``final_obs`` where an episode just ended."""
    if not dones.any():
        return obs
    nxt = obs.copy()
    final = infos["final_obs"]
    for i in np.flatnonzero(dones):
        nxt[i] = final[i]
    return nxt
