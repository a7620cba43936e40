"""The rate decayed after the warm-up, along a cosine or a line, to ``final_lr_scale`` of it at
``trainer.max_num_steps``."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from components import NonNegativeFloat
from recipes.errors import ConfigError
from recipes.lr_schedules.lr_schedule import LR_SCHEDULES, LRScheduleConfig, warmup


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
    warmup_steps, total = config.num_warmup_steps, max_num_steps
    return lambda step: min(1.0, (step - warmup_steps) / max(1, total - warmup_steps))


@LR_SCHEDULES.register("cosine", DecayConfig)
def cosine(config: DecayConfig, optimizer: Optimizer, max_num_steps: int | None) -> LRScheduler:
    """After the warm-up, a cosine decay to ``final_lr_scale`` x ``optimizer.lr`` at the last step."""
    progress, final = _progress(config, max_num_steps), config.final_lr_scale
    return warmup(
        config, optimizer, lambda step: final + (1.0 - final) * 0.5 * (1.0 + math.cos(math.pi * progress(step)))
    )


@LR_SCHEDULES.register("linear", DecayConfig)
def linear(config: DecayConfig, optimizer: Optimizer, max_num_steps: int | None) -> LRScheduler:
    """After the warm-up, a linear decay to ``final_lr_scale`` x ``optimizer.lr`` at the last step."""
    progress, final = _progress(config, max_num_steps), config.final_lr_scale
    return warmup(config, optimizer, lambda step: 1.0 - (1.0 - final) * progress(step))
