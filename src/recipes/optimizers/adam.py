"""Adam, with its weight decay apart from the gradient (``adamw``) or an L2 term of it (``adam``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

import torch
from torch.optim import Optimizer

from components import NonNegativeFloat, Range
from recipes.optimizers.dense_optimizer import OPTIMIZERS, OptimizerConfig


@dataclass
class AdamConfig(OptimizerConfig):
    betas: list[Annotated[float, Range(ge=0, lt=1)]] = field(default_factory=lambda: [0.9, 0.999])
    """Adam's ``beta1, beta2``: the decay of the gradient's running mean and of its square's."""
    eps: NonNegativeFloat = 1e-8
    """Added to the denominator, for numerical stability."""

    def __post_init__(self) -> None:
        if len(self.betas) != 2:
            raise ValueError(f"`betas` must have 2 values, but has {len(self.betas)} instead.")


@OPTIMIZERS.register("adamw", AdamConfig)
def adamw(config: AdamConfig, params: list[torch.nn.Parameter]) -> Optimizer:
    """Adam with weight decay apart from the gradient (Loshchilov and Hutter), the usual default."""
    betas = (config.betas[0], config.betas[1])
    return torch.optim.AdamW(params, lr=config.lr, betas=betas, eps=config.eps, weight_decay=config.weight_decay)


@OPTIMIZERS.register("adam", AdamConfig)
def adam(config: AdamConfig, params: list[torch.nn.Parameter]) -> Optimizer:
    """Adam, its weight decay an L2 term of the gradient."""
    betas = (config.betas[0], config.betas[1])
    return torch.optim.Adam(params, lr=config.lr, betas=betas, eps=config.eps, weight_decay=config.weight_decay)
