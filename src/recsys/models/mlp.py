"""The multi-layer perceptron every built-in model is made of."""

from __future__ import annotations

from torch import nn


def mlp(in_dim: int, hidden_dims: list[int], out_dim: int) -> nn.Sequential:
    """Linear + ReLU layers, then a linear output layer."""
    layers: list[nn.Module] = []
    for hidden in hidden_dims:
        layers += [nn.Linear(in_dim, hidden), nn.ReLU()]
        in_dim = hidden
    layers.append(nn.Linear(in_dim, out_dim))
    return nn.Sequential(*layers)
