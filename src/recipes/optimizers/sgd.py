"""Stochastic gradient descent, with momentum if asked."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.optim import Optimizer

from components import NonNegativeFloat
from recipes.optimizers.dense_optimizer import OPTIMIZERS, OptimizerConfig


@dataclass
class SGDConfig(OptimizerConfig):
    momentum: NonNegativeFloat = 0.0
    """SGD's momentum; 0: plain SGD."""


@OPTIMIZERS.register("sgd", SGDConfig)
def sgd(config: SGDConfig, params: list[torch.nn.Parameter]) -> Optimizer:
    """SGD, with momentum if ``momentum`` > 0."""
    return torch.optim.SGD(params, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)
