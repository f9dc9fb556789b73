"""PPO's policy for ``Box`` action spaces: a diagonal Gaussian, its log-std either
state-independent or state-dependent (gSDE).

As cleanrl's ``ppo_continuous_action.py``: separate tanh MLPs for the action mean and the value
(orthogonal init, gain 0.01 for the mean's output layer, 1 for the value's), one learned log-std
per action dimension starting at ``algo.log_std_init``, observations and rewards normalised with
running statistics (:mod:`tianji_dask.algos.ppo.normalization`). The action sampled is what the
rollout keeps and its log-probability is that of the sampled action; only the env gets it
clipped to the space's bounds (:meth:`GaussianPolicy.env_actions`), as gymnasium's
``ClipAction`` does in cleanrl.

With ``algo.use_sde`` (generalized state-dependent exploration, Raffin et al. 2022, as
stable-baselines3's ``StateDependentNoiseDistribution`` with ``full_std``): the exploration noise
of env i is ``z(s) @ W_i``, ``z(s)`` the mean network's last hidden features (detached: the
noise does not train them) and ``W_i`` a ``(features, action_dim)`` matrix with entries drawn
from ``N(0, exp(log_std)^2)`` every ``algo.sde_sample_freq`` steps, so that an action is a
Gaussian of mean ``mu(s)`` and variance ``z(s)^2 @ exp(log_std)^2`` (plus 1e-6) per dimension,
and consecutive actions of one env explore in one direction instead of jittering.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn

from tianji_dask.algos.ppo.mlp import tanh_mlp
from tianji_dask.algos.ppo.normalization import RolloutNormalizer, RunningMoments

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
SDE_VARIANCE_EPS = 1e-6  # stable-baselines3's: keeps the std of all-zero features above zero


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

    def __init__(
        self, obs_dim: int, action_dim: int, hidden: list[int], *, sde: bool = False, log_std_init: float = 0.0
    ):
        super().__init__()
        self.sde = sde
        self.actor_mean = tanh_mlp(obs_dim, action_dim, hidden, 0.01)
        features = hidden[-1] if hidden else obs_dim
        self.actor_logstd = nn.Parameter(torch.full((features, action_dim) if sde else (action_dim,), log_std_init))
        self.critic = tanh_mlp(obs_dim, 1, hidden, 1.0)
        self.obs_moments = RunningMoments((obs_dim,))
        self.return_moments = RunningMoments(())

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)

    def policy(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(action means, log-stds, the mean network's last hidden features) of a batch; with
        gSDE the log-std of each action depends on the features (detached)."""
        features = self.actor_mean[:-1](obs)
        mean = self.actor_mean[-1](features)
        if not self.sde:
            return mean, self.actor_logstd.expand_as(mean), features
        features = features.detach()
        variance = features.square() @ torch.exp(2 * self.actor_logstd) + SDE_VARIANCE_EPS
        return mean, 0.5 * torch.log(variance), features

    def heads(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(action means, values) of a batch."""
        return self.actor_mean(obs), self.value(obs)

    def evaluate(self, obs: torch.Tensor, actions: torch.Tensor):
        """(log-prob of ``actions``, entropy, value) under the current parameters."""
        mean, log_std, _ = self.policy(obs)
        return gaussian_log_prob(mean, log_std, actions), gaussian_entropy(log_std), self.value(obs)


class GaussianPolicy:
    """Inference in an actor for a ``Box`` action space of shape ``(action_dim,)``.

    ``act(obs, envs)`` -> (actions ``(N, action_dim)`` float32, log-probs, values) as numpy, the
    normal draws from a CPU generator whatever the device (a seed gives the same actions on CPU
    and GPU); ``exploration_step(t)`` comes before each rollout step (gSDE's draws). ``load``
    takes the statistics published with the parameters; ``observe``, ``normalize``,
    ``training_rewards`` and ``rollout_statistics`` are the normalisation of
    :class:`~tianji_dask.algos.ppo.normalization.RolloutNormalizer`; ``env_actions`` clips to
    the bounds."""

    action_dtype = np.float32
    chooses_ahead = False  # its observation statistics and gSDE draws change with each step's bookkeeping

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
        *,
        sde_sample_freq: int | None = None,
        log_std_init: float = 0.0,
        normalize_observations: bool = True,
        normalize_rewards: bool = True,
    ):
        self.device = torch.device(device)
        self.low, self.high = np.asarray(low, np.float32), np.asarray(high, np.float32)
        self.action_shape: tuple[int, ...] = self.low.shape
        sde = sde_sample_freq is not None
        self.net = GaussianActorCritic(obs_dim, int(self.low.size), hidden, sde=sde, log_std_init=log_std_init)
        self.net.to(self.device).requires_grad_(False)
        self.generator = torch.Generator().manual_seed(seed)
        self.normalizer = RolloutNormalizer(
            num_envs, (obs_dim,), gamma, observations=normalize_observations, rewards=normalize_rewards
        )
        self.version = -1
        self.num_envs = num_envs
        self.sde_sample_freq = sde_sample_freq
        self._exploration: torch.Tensor | None = None  # gSDE: one (features, action_dim) matrix per env

    def load(self, version: int, params: dict) -> None:
        self.net.load_state_dict({k: torch.as_tensor(v) for k, v in params.items()})
        self.normalizer.load(self.net.obs_moments.moments(), self.net.return_moments.moments())
        self.version = version

    def exploration_step(self, t: int) -> None:
        """Called before step ``t`` of a rollout (0 first): gSDE draws new exploration matrices
        for every env at the start of a rollout and every ``sde_sample_freq`` steps."""
        freq = self.sde_sample_freq
        if freq is None or not (t == 0 or (freq > 0 and t % freq == 0)):
            return
        self._exploration = self._exploration_matrices(self.num_envs)

    def _exploration_matrices(self, n: int) -> torch.Tensor:
        std = self.net.actor_logstd.detach().exp().cpu()
        draws = torch.randn((n, *std.shape), generator=self.generator)
        return (draws * std).to(self.device)

    def act(self, obs: np.ndarray, envs: slice = slice(None)) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(actions, log-probs, values) for the observations of the envs ``envs``."""
        with torch.inference_mode():
            x = torch.from_numpy(obs).to(self.device)
            mean, log_std, features = self.net.policy(x)
            if self.net.sde:
                assert self._exploration is not None, "exploration_step(0) comes before the first act"
                noise = torch.bmm(features.unsqueeze(1), self._exploration[envs]).squeeze(1)
            else:
                draws = torch.randn((len(obs), *self.action_shape), generator=self.generator)
                noise = draws.to(self.device) * log_std.exp()
            actions = mean + noise
            logp = gaussian_log_prob(mean, log_std, actions)
            return actions.cpu().numpy(), logp.cpu().numpy(), self.net.value(x).cpu().numpy()

    def most_likely(self, obs: np.ndarray) -> np.ndarray:
        """The mean action of each raw observation (normalised as in training, the running
        statistics unchanged), clipped to the space's bounds: evaluation, no noise."""
        with torch.inference_mode():
            mean, _, _ = self.net.policy(torch.from_numpy(self.normalize(obs)).to(self.device))
            return self.env_actions(mean.cpu().numpy())

    def sample(self, obs: np.ndarray) -> np.ndarray:
        """Actions drawn from the policy for raw observations (normalised as :meth:`most_likely`
        does), clipped to the bounds: a trained policy used with its randomness, not an actor's
        (gSDE draws each row's exploration matrix afresh)."""
        if self.net.sde:
            self._exploration = self._exploration_matrices(len(obs))
        return self.env_actions(self.act(self.normalize(obs))[0])

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
