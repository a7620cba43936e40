"""The learning-rate schedules the ``lr_scheduler`` section chooses by name; a package may add its own.

The built-in ones warm up linearly over ``num_warmup_steps``, then keep the rate, or decay it to
``final_lr_scale`` times the rate at ``trainer.max_num_steps`` along a cosine or a line.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR, LRScheduler

from components import NonNegativeFloat, NonNegativeInt, Registry
from recipes.errors import ConfigError


@dataclass
class LRScheduleConfig:
    name: str = "constant"
    num_warmup_steps: NonNegativeInt = 0
    """Steps of linear warm-up from 0 to ``optimizer.lr``, before the schedule proper."""

    @property
    def decays_over_max_num_steps(self) -> bool:
        """Whether the rate at a step depends on ``trainer.max_num_steps``, which a resume must then keep."""
        return False


LRScheduleFactory = Callable[[Any, Optimizer, "int | None"], LRScheduler]
"""``factory(config, optimizer, max_num_steps)``: the scheduler stepped once per optimizer step."""

LR_SCHEDULES: Registry[LRScheduleFactory] = Registry("LR schedule", "recipes.lr_schedules", LRScheduleConfig)


def build_lr_scheduler(config: LRScheduleConfig, optimizer: Optimizer, max_num_steps: int | None) -> LRScheduler:
    return LR_SCHEDULES.get(config.name).value(config, optimizer, max_num_steps)


def _warmup(config: LRScheduleConfig, optimizer: Optimizer, after: Callable[[int], float]) -> LambdaLR:
    """Linear warm-up to the full rate, then ``after(step)`` times it."""
    warmup = config.num_warmup_steps
    return LambdaLR(optimizer, lambda step: (step + 1) / warmup if step < warmup else after(step))


@LR_SCHEDULES.register("constant")
def constant(config: LRScheduleConfig, optimizer: Optimizer, max_num_steps: int | None) -> LRScheduler:
    """After the warm-up, ``optimizer.lr`` throughout."""
    return _warmup(config, optimizer, lambda step: 1.0)


@dataclass
class DecayConfig(LRScheduleConfig):
    final_lr_scale: NonNegativeFloat = 0.0
    """The rate at the last step, as a fraction of ``optimizer.lr``."""

    @property
    def decays_over_max_num_steps(self) -> bool:
        return True


def _progress(config: DecayConfig, max_num_steps: int | None) -> Callable[[int], float]:
    """How far a step is from the end of warm-up (0) to the last step (1)."""
    if max_num_steps is None:
        raise ConfigError(f"`lr_scheduler.name: {config.name}` decays over `trainer.max_num_steps`, which must be set.")
    warmup, total = config.num_warmup_steps, max_num_steps
    return lambda step: min(1.0, (step - warmup) / max(1, total - warmup))


@LR_SCHEDULES.register("cosine", DecayConfig)
def cosine(config: DecayConfig, optimizer: Optimizer, max_num_steps: int | None) -> LRScheduler:
    """After the warm-up, a cosine decay to ``final_lr_scale`` x ``optimizer.lr`` at the last step."""
    progress, final = _progress(config, max_num_steps), config.final_lr_scale
    return _warmup(
        config, optimizer, lambda step: final + (1.0 - final) * 0.5 * (1.0 + math.cos(math.pi * progress(step)))
    )


@LR_SCHEDULES.register("linear", DecayConfig)
def linear(config: DecayConfig, optimizer: Optimizer, max_num_steps: int | None) -> LRScheduler:
    """After the warm-up, a linear decay to ``final_lr_scale`` x ``optimizer.lr`` at the last step."""
    progress, final = _progress(config, max_num_steps), config.final_lr_scale
    return _warmup(config, optimizer, lambda step: 1.0 - (1.0 - final) * progress(step))
