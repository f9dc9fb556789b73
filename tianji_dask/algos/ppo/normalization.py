"""Running normalisation of observations and rewards for PPO's Gaussian policy.

What cleanrl's ``ppo_continuous_action.py`` gets from gymnasium's ``NormalizeObservation`` and
``NormalizeReward`` wrappers (each followed by a clip to [-10, 10]), split between the roles:

* The learner owns the statistics: :class:`RunningMoments` buffers of its network (count, mean
  and variance of the raw observations, and of each env's discounted return), so they are in
  its ``state_dict``: checkpointed and restored with the network, and published with the
  parameters.
* An actor normalises with the statistics of the parameter version it acts with
  (:class:`RolloutNormalizer`): observations become ``clip((obs - mean) / sqrt(var + 1e-8))``,
  rewards ``clip(reward / sqrt(return_var + 1e-8))``, and the rollout carries what the policy
  saw. It also gathers the rollout's own moments (:meth:`RolloutNormalizer.take`), which the
  learner folds into its statistics when it first trains on the rollout (Chan et al.'s
  parallel update, as gymnasium's ``RunningMeanStd``).

The discounted return that scales rewards follows gymnasium's ``NormalizeReward``:
``G = G * gamma * (1 - terminated) + reward`` per env, never reset by a truncation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn

#: Added to a variance before its square root.
VARIANCE_EPS = 1e-8
#: Normalised observations and scaled rewards are clipped to [-CLIP, CLIP].
CLIP = 10.0
#: gymnasium's RunningMeanStd starts at mean 0 and variance 1 with this weight.
INITIAL_COUNT = 1e-4
#: The running statistics' names: submodules of the network, and fields of a rollout.
OBS_MOMENTS = "obs_moments"
RETURN_MOMENTS = "return_moments"


@dataclass(frozen=True)
class Moments:
    """Count, mean and (population) variance of samples, per component."""

    count: float
    mean: np.ndarray
    var: np.ndarray

    @classmethod
    def initial(cls, shape: tuple[int, ...]) -> Moments:
        return cls(INITIAL_COUNT, np.zeros(shape), np.ones(shape))

    @classmethod
    def of(cls, samples: np.ndarray) -> Moments:
        """The moments of ``samples`` along their first axis."""
        x = np.asarray(samples, dtype=np.float64)
        if len(x) == 0:
            return cls(0.0, np.zeros(x.shape[1:]), np.zeros(x.shape[1:]))
        return cls(float(len(x)), x.mean(axis=0), x.var(axis=0))

    def merged(self, other: Moments) -> Moments:
        """The moments of both sets of samples together."""
        total = self.count + other.count
        if other.count == 0:
            return self
        delta = other.mean - self.mean
        mean = self.mean + delta * (other.count / total)
        m2 = self.var * self.count + other.var * other.count + delta**2 * (self.count * other.count / total)
        return Moments(total, mean, m2 / total)

    def pack(self) -> np.ndarray:
        """``[count, *mean, *var]`` as one float64 array (how a rollout carries them)."""
        return np.concatenate([[self.count], np.ravel(self.mean), np.ravel(self.var)]).astype(np.float64)

    @classmethod
    def unpack(cls, packed: np.ndarray, shape: tuple[int, ...]) -> Moments:
        n = int(np.prod(shape))
        if packed.shape != (1 + 2 * n,):
            raise ValueError(f"packed moments of shape {shape} have {1 + 2 * n} values, got {packed.shape}")
        return cls(float(packed[0]), packed[1 : 1 + n].reshape(shape), packed[1 + n :].reshape(shape))


class RunningMoments(nn.Module):
    """Running count, mean and variance as float64 buffers of a network (no gradients)."""

    count: torch.Tensor
    mean: torch.Tensor
    var: torch.Tensor

    def __init__(self, shape: tuple[int, ...]):
        super().__init__()
        start = Moments.initial(shape)
        self.register_buffer("count", torch.tensor(start.count, dtype=torch.float64))
        self.register_buffer("mean", torch.from_numpy(start.mean))
        self.register_buffer("var", torch.from_numpy(start.var))

    def moments(self) -> Moments:
        return Moments(float(self.count), self.mean.cpu().numpy().copy(), self.var.cpu().numpy().copy())

    @torch.no_grad()
    def merge(self, other: Moments) -> None:
        """Fold ``other`` in, in place (the buffers keep their storage and device)."""
        new = self.moments().merged(other)
        self.count.fill_(new.count)
        self.mean.copy_(torch.from_numpy(np.asarray(new.mean, dtype=np.float64)))
        self.var.copy_(torch.from_numpy(np.asarray(new.var, dtype=np.float64)))


class RolloutNormalizer:
    """An actor's side: normalise with one parameter version's statistics, gather the rollout's.

    Protocol: ``load(obs_moments, return_moments)`` with each new version; per vector step
    ``observe(raw_obs)`` (normalised observations, recorded) and ``rewards(rewards,
    terminated)`` (scaled rewards, returns recorded); ``normalize(raw_obs)`` normalises without
    recording (a truncated episode's final observation, or the current one again under a new
    version); ``take()`` at the end of a rollout returns its moments and starts the next.
    ``observations=False`` / ``rewards=False`` pass those through as the env gives them
    (unclipped; the moments are still gathered)."""

    def __init__(
        self,
        num_envs: int,
        obs_shape: tuple[int, ...],
        gamma: float,
        *,
        observations: bool = True,
        rewards: bool = True,
    ):
        self.gamma = gamma
        self.normalizes_observations, self.scales_rewards = observations, rewards
        self.obs_shape = obs_shape
        self.discounted = np.zeros(num_envs, dtype=np.float64)  # each env's G, across rollouts
        self._seen_obs: list[np.ndarray] = []
        self._seen_returns: list[np.ndarray] = []
        self.load(Moments.initial(obs_shape), Moments.initial(()))

    def load(self, obs: Moments, returns: Moments) -> None:
        self._obs_mean = np.asarray(obs.mean, dtype=np.float64)
        self._obs_scale = 1.0 / np.sqrt(np.asarray(obs.var, dtype=np.float64) + VARIANCE_EPS)
        self._reward_scale = 1.0 / float(np.sqrt(float(returns.var) + VARIANCE_EPS))

    def normalize(self, raw: np.ndarray) -> np.ndarray:
        if not self.normalizes_observations:
            return np.asarray(raw, dtype=np.float32)
        return np.clip((raw - self._obs_mean) * self._obs_scale, -CLIP, CLIP).astype(np.float32)

    def observe(self, raw: np.ndarray) -> np.ndarray:
        self._seen_obs.append(np.array(raw, dtype=np.float64))
        return self.normalize(raw)

    def rewards(self, rewards: np.ndarray, terminated: np.ndarray) -> np.ndarray:
        self.discounted = self.discounted * self.gamma * (1.0 - terminated) + rewards
        self._seen_returns.append(self.discounted.copy())
        if not self.scales_rewards:
            return np.asarray(rewards, dtype=np.float32)
        return np.clip(rewards * self._reward_scale, -CLIP, CLIP).astype(np.float32)

    def take(self) -> dict[str, np.ndarray]:
        """The moments of the raw observations and discounted returns seen since the last take."""
        obs = np.concatenate(self._seen_obs) if self._seen_obs else np.empty((0, *self.obs_shape))
        returns = np.concatenate(self._seen_returns) if self._seen_returns else np.empty(0)
        self._seen_obs, self._seen_returns = [], []
        return {OBS_MOMENTS: Moments.of(obs).pack(), RETURN_MOMENTS: Moments.of(returns).pack()}
