"""Adagrad: each parameter's rate scaled down by the sum of its squared gradients."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.optim import Optimizer

from components import NonNegativeFloat
from recipes.optimizers.dense_optimizer import OPTIMIZERS, OptimizerConfig


@dataclass
class AdagradConfig(OptimizerConfig):
    eps: NonNegativeFloat = 1e-8
    """Added to the denominator, for numerical stability."""


@OPTIMIZERS.register("adagrad", AdagradConfig)
def adagrad(config: AdagradConfig, params: list[torch.nn.Parameter]) -> Optimizer:
    """Adagrad: each parameter's step scaled by its own history of squared gradients."""
    return torch.optim.Adagrad(params, lr=config.lr, eps=config.eps, weight_decay=config.weight_decay)
