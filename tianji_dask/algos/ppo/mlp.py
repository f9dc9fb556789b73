"""The tanh MLPs of PPO's actor-critics over flat observations, with orthogonal init as
cleanrl's ``ppo.py`` and ``ppo_continuous_action.py``: gain sqrt(2) in the hidden layers, a
gain of the caller's choice for the output layer (0.01 for a policy head, 1 for a value head),
zero biases."""

from __future__ import annotations

import math

import torch.nn as nn


def orthogonal_linear(i: int, o: int, std: float = math.sqrt(2)) -> nn.Linear:
    layer = nn.Linear(i, o)
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, 0.0)
    return layer


def tanh_mlp(i: int, o: int, hidden: list[int], out_std: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [orthogonal_linear(i, h), nn.Tanh()]
        i = h
    layers.append(orthogonal_linear(i, o, out_std))
    return nn.Sequential(*layers)
