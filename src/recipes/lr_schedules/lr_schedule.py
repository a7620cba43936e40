"""The kind "LR schedule": ``LR_SCHEDULES``, the config every schedule's derives from, building one, and the
linear warm-up the built-in schedules share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR, LRScheduler

from components import NonNegativeInt, Registry


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


def warmup(config: LRScheduleConfig, optimizer: Optimizer, after: Callable[[int], float]) -> LambdaLR:
    """Linear warm-up to the full rate, then ``after(step)`` times it."""
    steps = config.num_warmup_steps
    return LambdaLR(optimizer, lambda step: (step + 1) / steps if step < steps else after(step))
