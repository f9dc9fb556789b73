"""Image networks for Atari: the Nature DQN CNN and the Nature CNN actor-critic.

Both take uint8 frame stacks ``(B, 4, 84, 84)`` and convert to float (divide by 255) inside
``forward``: observations stay uint8 everywhere else (actors, channels, replay), a quarter of
the bytes of float32. Which network a run uses is derived from the config
(:func:`network_kind`): ``nature_cnn`` for ``env.kind: atari``, the MLPs otherwise.

* :class:`NatureQNetwork`: conv 32x8x8/4, 64x4x4/2, 64x3x3/1, fc 512, one Q-value per action
  (Mnih et al. 2015; cleanrl's ``dqn_atari.py``, PyTorch's default init), or the dueling
  architecture's two streams (:class:`DuelingHead`).
* :class:`AtariActorCritic`: the same trunk shared by a policy head and a value head, with
  orthogonal init as cleanrl's ``ppo_atari.py`` (gain sqrt(2) in the trunk, 0.01 for the
  policy head, 1 for the value head, zero biases).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributions import Categorical

from tianji_dask.config.schema import Precision
from tianji_dask.envs import ATARI_FRAME_STACK

if TYPE_CHECKING:
    from tianji_dask.config.schema import ExperimentConfig

#: Features after the trunk's last convolution for 84x84 input: 64 channels of 7x7.
TRUNK_FEATURES = 64 * 7 * 7


def network_kind(cfg: ExperimentConfig) -> str:
    """``"nature_cnn"`` for image observations (``env.kind: atari``), else ``"mlp"``."""
    return "nature_cnn" if cfg.env.frame_stacks else "mlp"


def _to_float(obs: torch.Tensor) -> torch.Tensor:
    """uint8 pixels -> float in [0, 1]; float input is taken as already scaled."""
    if obs.dtype == torch.uint8:
        return obs.float().div_(255.0)
    return obs


def trunk_features(trunk: nn.Sequential, obs: torch.Tensor, precision: Precision) -> torch.Tensor:
    """The Nature CNN trunk's float32 output on uint8 frame stacks, computed as ``precision``
    says: "fp32" on frames as they come; "tf32" on channels-last frames (tensor cores take NHWC
    without transposes; :func:`set_trunk_precision` allows TF32 matmuls); "bf16" on
    channels-last frames under autocast to bfloat16, the output cast back to float32, so the
    heads, the loss and every parameter and gradient stay float32. Both compute the first
    convolution on the frames cut into blocks (:func:`_blocked_conv`)."""
    if precision == "fp32":
        return trunk(_to_float(obs))
    first = trunk[0]
    assert isinstance(first, nn.Conv2d)
    if precision == "tf32":
        return trunk[1:](_blocked_conv(first, obs))
    # no cast cache: each weight is cast once per forward anyway, and a cache must not
    # outlive a CUDA graph's capture
    with torch.autocast(obs.device.type, dtype=torch.bfloat16, cache_enabled=False):
        h = trunk[1:](_blocked_conv(first, obs))
    return h.float()


def _blocked_conv(conv: nn.Conv2d, obs: torch.Tensor) -> torch.Tensor:
    """``conv`` (kernel k, stride r, r dividing k) on uint8 frames cut into r x r blocks
    (``pixel_unshuffle``, as uint8: a quarter of the bytes; channels-last like the rest of the
    trunk): the same function as a (k/r) x (k/r) convolution of stride 1 over ``c r^2``
    channels. The Nature CNN's first layer, 8x8 stride 4 over 4 channels, becomes 2x2 over 64,
    which tensor-core kernels take; cuDNN runs 4 input channels in channels-last with a generic
    kernel several times slower. The weight is rearranged at each call (8,192 numbers), so
    parameters, gradients and checkpoints keep their usual shape."""
    w = conv.weight
    out, c, k, _ = w.shape
    r = conv.stride[0]
    n = k // r
    blocks = _to_float(F.pixel_unshuffle(obs, r).contiguous(memory_format=torch.channels_last))
    # w[o, ch, a r + p, b r + q] -> w'[o, ch r^2 + p r + q, a, b], laid out channels-last
    w = w.view(out, c, n, r, n, r).permute(0, 2, 4, 1, 3, 5).reshape(out, n, n, c * r * r).permute(0, 3, 1, 2)
    return F.conv2d(blocks, w, conv.bias)


def set_trunk_precision(net: nn.Module, precision: Precision, device: torch.device) -> None:
    """A learner's ``algo.precision`` on its Nature CNN (actors keep "fp32"); "tf32" on CUDA
    also turns on TF32 matmuls, a process-wide switch read when a matmul is launched or
    captured (the 512-unit layer's forward and backward; cuDNN's convolutions use TF32 by
    default already). The convolutions' weights go channels-last like the frames, so that
    cuDNN converts neither weights nor their gradients at each update; parameters leave the
    learner in the usual layout (``policy_params``)."""
    if precision == "fp32":
        return
    if not isinstance(net, (NatureQNetwork, AtariActorCritic)):
        raise ValueError(f"algo.precision={precision} needs the Nature CNN, not {type(net).__name__}")
    net.precision = precision
    net.trunk.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # missing from the stubs
    if precision == "tf32" and device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True


def nature_trunk(in_channels: int = ATARI_FRAME_STACK, init=None, fc: bool = True) -> nn.Sequential:
    """The three convolutions and (``fc``) the 512-unit layer, ReLU after each."""
    layers: list[nn.Linear | nn.Conv2d] = [
        nn.Conv2d(in_channels, 32, 8, stride=4),
        nn.Conv2d(32, 64, 4, stride=2),
        nn.Conv2d(64, 64, 3, stride=1),
    ]
    if fc:
        layers.append(nn.Linear(TRUNK_FEATURES, 512))
    if init is not None:
        for layer in layers:
            init(layer)
    modules: list[nn.Module] = [layers[0], nn.ReLU(), layers[1], nn.ReLU(), layers[2], nn.ReLU(), nn.Flatten()]
    if fc:
        modules += [layers[3], nn.ReLU()]
    return nn.Sequential(*modules)


class DuelingHead(nn.Module):
    """Q = V + A - mean_a A (Wang et al. 2016): a value stream and an advantage stream over the
    same features, each with one hidden layer of ``hidden`` units (none when 0)."""

    def __init__(self, in_features: int, n_actions: int, hidden: int = 0):
        super().__init__()

        def stream(out: int) -> nn.Module:
            if not hidden:
                return nn.Linear(in_features, out)
            return nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, out))

        self.value = stream(1)
        self.advantage = stream(n_actions)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        a = self.advantage(features)
        return self.value(features) + a - a.mean(dim=1, keepdim=True)


class NatureQNetwork(nn.Module):
    """Q-values ``(B, n_actions)`` of uint8 frame stacks ``(B, 4, 84, 84)``; ``dueling``: the
    convolutions feed a value and an advantage stream of 512 units each, as Wang et al."""

    def __init__(self, n_actions: int, in_channels: int = ATARI_FRAME_STACK, dueling: bool = False):
        super().__init__()
        self.trunk = nature_trunk(in_channels, fc=not dueling)
        self.head: nn.Module = DuelingHead(TRUNK_FEATURES, n_actions, 512) if dueling else nn.Linear(512, n_actions)
        #: How the trunk computes (:func:`trunk_features`): a learner's ``algo.precision``.
        self.precision: Precision = "fp32"

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(trunk_features(self.trunk, obs, self.precision))


def _orthogonal(std: float = math.sqrt(2)):
    def init(layer: nn.Linear | nn.Conv2d) -> nn.Linear | nn.Conv2d:
        nn.init.orthogonal_(layer.weight, std)
        assert layer.bias is not None
        nn.init.constant_(layer.bias, 0.0)
        return layer

    return init


class AtariActorCritic(nn.Module):
    """Shared Nature CNN trunk, policy head (logits) and value head, as cleanrl's ppo_atari.

    Same interface as :class:`tianji_dask.algos.ppo.ActorCritic`: ``heads``, ``value``,
    ``evaluate``; the trunk runs once per call.
    """

    def __init__(self, n_actions: int, in_channels: int = ATARI_FRAME_STACK):
        super().__init__()
        self.trunk = nature_trunk(in_channels, init=_orthogonal())
        self.actor = _orthogonal(0.01)(nn.Linear(512, n_actions))
        self.critic = _orthogonal(1.0)(nn.Linear(512, 1))
        #: How the trunk computes (:func:`trunk_features`): a learner's ``algo.precision``.
        self.precision: Precision = "fp32"

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        """The trunk's 512 float32 features of a batch of frame stacks."""
        return trunk_features(self.trunk, obs, self.precision)

    def heads(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, value) of a batch."""
        h = self.features(obs)
        return self.actor(h), self.critic(h).squeeze(-1)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(self.features(obs)).squeeze(-1)

    def evaluate(self, obs: torch.Tensor, actions: torch.Tensor):
        """(log-prob of ``actions``, entropy, value) under the current parameters."""
        logits, value = self.heads(obs)
        dist = Categorical(logits=logits, validate_args=False)  # validating waits for the GPU
        return dist.log_prob(actions), dist.entropy(), value
