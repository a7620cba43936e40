"""The dense optimizers the ``optimizer`` section chooses by name; a package may add its own.

Each registers with its config dataclass, so a key one optimizer takes is refused on another
(``optimizer.momentum`` on ``adamw``), and a factory that builds it over the parameters to train.
The sparse tables have their own optimizers (``model.embeddings.sparse_optimizer``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Annotated, Any

import torch
from torch.optim import Optimizer

from components import NonNegativeFloat, PositiveFloat, Range, Registry


@dataclass
class OptimizerConfig:
    """What every dense optimizer takes: the learning rate an LR schedule scales, and weight decay."""

    name: str = "adamw"
    lr: PositiveFloat = 1e-3
    """The learning rate (an LR schedule scales it, the sparse tables' with it)."""
    weight_decay: NonNegativeFloat = 0.0
    """Weight decay: decoupled from the gradient for ``adamw``, an L2 term of it for the others."""


OptimizerFactory = Callable[[Any, list[torch.nn.Parameter]], Optimizer]
"""``factory(config, params)``: the optimizer over ``params``, configured by its own config dataclass."""

OPTIMIZERS: Registry[OptimizerFactory] = Registry("optimizer", "recipes.optimizers", OptimizerConfig)


def build_optimizer(config: OptimizerConfig, params: Iterable[torch.nn.Parameter]) -> Optimizer:
    """The optimizer ``config`` names, over the parameters that require gradients."""
    return OPTIMIZERS.get(config.name).value(config, [p for p in params if p.requires_grad])


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


@dataclass
class SGDConfig(OptimizerConfig):
    momentum: NonNegativeFloat = 0.0
    """SGD's momentum; 0: plain SGD."""


@OPTIMIZERS.register("sgd", SGDConfig)
def sgd(config: SGDConfig, params: list[torch.nn.Parameter]) -> Optimizer:
    """SGD, with momentum if ``momentum`` > 0."""
    return torch.optim.SGD(params, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)


@dataclass
class AdagradConfig(OptimizerConfig):
    eps: NonNegativeFloat = 1e-8
    """Added to the denominator, for numerical stability."""


@OPTIMIZERS.register("adagrad", AdagradConfig)
def adagrad(config: AdagradConfig, params: list[torch.nn.Parameter]) -> Optimizer:
    """Adagrad: each parameter's step scaled by its own history of squared gradients."""
    return torch.optim.Adagrad(params, lr=config.lr, eps=config.eps, weight_decay=config.weight_decay)
