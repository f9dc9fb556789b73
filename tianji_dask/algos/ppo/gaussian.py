"""PPO's policy for ``Box`` action spaces: a diagonal Gaussian with a state-independent log-std.

As cleanrl's ``ppo_continuous_action.py``: separate tanh MLPs for the action mean and the value
(orthogonal init, gain 0.01 for the mean's output layer, 1 for the value's), one learned log-std
per action dimension starting at 0, observations and rewards normalised with running statistics
(:mod:`tianji_dask.algos.ppo.normalization`). The action sampled is what the rollout keeps and
its log-probability is that of the sampled action; only the env gets it clipped to the space's
bounds (:meth:`GaussianPolicy.env_actions`), as gymnasium's ``ClipAction`` does in cleanrl.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn

from tianji_dask.algos.ppo.mlp import tanh_mlp
from tianji_dask.algos.ppo.normalization import RolloutNormalizer, RunningMoments

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def gaussian_log_prob(mean: torch.Tensor, log_std: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """log N(actions; mean, diag(exp(log_std))^2), summed over the last (action) axis."""
    z = (actions - mean) * torch.exp(-log_std)
    return (-0.5 * z * z - log_std - _LOG_SQRT_2PI).sum(-1)


def gaussian_entropy(log_std: torch.Tensor) -> torch.Tensor:
    """Entropy of a diagonal Gaussian, summed over the last axis: sum(1/2 + log sqrt(2 pi) + log_std)."""
    return (0.5 + _LOG_SQRT_2PI + log_std).sum(-1)


class GaussianActorCritic(nn.Module):
    """Action mean and value MLPs, a log-std parameter, and the running statistics.

    Same interface as :class:`~tianji_dask.algos.ppo.core.ActorCritic`: ``heads`` (action means
    and values), ``value``, ``evaluate``. The statistics (``obs_moments``, ``return_moments``)
    are buffers: the forward pass does not read them (observations arrive normalised), but they
    are part of the ``state_dict``, so the learner checkpoints them and publishes them with the
    parameters."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: list[int]):
        super().__init__()
        self.actor_mean = tanh_mlp(obs_dim, action_dim, hidden, 0.01)
        self.actor_logstd = nn.Parameter(torch.zeros(action_dim))
        self.critic = tanh_mlp(obs_dim, 1, hidden, 1.0)
        self.obs_moments = RunningMoments((obs_dim,))
        self.return_moments = RunningMoments(())

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)

    def heads(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(action means, values) of a batch."""
        return self.actor_mean(obs), self.value(obs)

    def evaluate(self, obs: torch.Tensor, actions: torch.Tensor):
        """(log-prob of ``actions``, entropy, value) under the current parameters."""
        mean = self.actor_mean(obs)
        log_std = self.actor_logstd.expand_as(mean)
        return gaussian_log_prob(mean, log_std, actions), gaussian_entropy(log_std), self.value(obs)


class GaussianPolicy:
    """Inference in an actor for a ``Box`` action space of shape ``(action_dim,)``.

    ``act(obs)`` -> (actions ``(N, action_dim)`` float32, log-probs, values) as numpy, the
    normal draws from a CPU generator whatever the device (a seed gives the same actions on CPU
    and GPU). ``load`` takes the statistics published with the parameters; ``observe``,
    ``normalize``, ``training_rewards`` and ``rollout_statistics`` are the normalisation of
    :class:`~tianji_dask.algos.ppo.normalization.RolloutNormalizer`; ``env_actions`` clips to
    the bounds."""

    action_dtype = np.float32

    def __init__(
        self,
        obs_dim: int,
        low: np.ndarray,
        high: np.ndarray,
        hidden: list[int],
        seed: int,
        gamma: float,
        num_envs: int,
        device: str = "cpu",
    ):
        self.device = torch.device(device)
        self.low, self.high = np.asarray(low, np.float32), np.asarray(high, np.float32)
        self.action_shape: tuple[int, ...] = self.low.shape
        self.net = GaussianActorCritic(obs_dim, int(self.low.size), hidden).to(self.device)
        self.net.requires_grad_(False)
        self.generator = torch.Generator().manual_seed(seed)
        self.normalizer = RolloutNormalizer(num_envs, (obs_dim,), gamma)
        self.version = -1

    def load(self, version: int, params: dict) -> None:
        self.net.load_state_dict({k: torch.as_tensor(v) for k, v in params.items()})
        self.normalizer.load(self.net.obs_moments.moments(), self.net.return_moments.moments())
        self.version = version

    def act(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        noise = torch.randn((len(obs), *self.action_shape), generator=self.generator)
        with torch.inference_mode():
            mean, values = self.net.heads(torch.from_numpy(obs).to(self.device))
            log_std = self.net.actor_logstd.expand_as(mean)
            actions = mean + noise.to(self.device) * log_std.exp()
            logp = gaussian_log_prob(mean, log_std, actions)
            return actions.cpu().numpy(), logp.cpu().numpy(), values.cpu().numpy()

    def value(self, obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return self.net.value(torch.from_numpy(obs).to(self.device)).cpu().numpy()

    def env_actions(self, actions: np.ndarray) -> np.ndarray:
        """What the env gets: the actions clipped to the space's bounds (the rollout keeps them unclipped)."""
        return np.clip(actions, self.low, self.high)

    def normalize(self, raw_obs: np.ndarray) -> np.ndarray:
        return self.normalizer.normalize(raw_obs)

    def observe(self, raw_obs: np.ndarray) -> np.ndarray:
        return self.normalizer.observe(raw_obs)

    def training_rewards(self, rewards: np.ndarray, terminated: np.ndarray) -> np.ndarray:
        return self.normalizer.rewards(rewards, terminated)

    def rollout_statistics(self) -> dict[str, np.ndarray]:
        """The finished rollout's moments, named as the network's buffers (``obs_moments``,
        ``return_moments``) for :meth:`PPOLearner.merge_statistics`."""
        return self.normalizer.take()
