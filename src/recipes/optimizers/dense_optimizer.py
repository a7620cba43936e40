"""The kind "dense optimizer": ``OPTIMIZERS``, the config every optimizer's derives from, and building one.

Each optimizer registers with its config dataclass, so a key one optimizer takes is refused on another
(``optimizer.momentum`` on ``adamw``), and a factory that builds it over the parameters to train.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim import Optimizer

from components import NonNegativeFloat, PositiveFloat, Registry


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
