"""The constant rate, after the warm-up."""

from __future__ import annotations

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from recipes.lr_schedules.lr_schedule import LR_SCHEDULES, LRScheduleConfig, warmup


@LR_SCHEDULES.register("constant")
def constant(config: LRScheduleConfig, optimizer: Optimizer, max_num_steps: int | None) -> LRScheduler:
    """After the warm-up, ``optimizer.lr`` throughout."""
    return warmup(config, optimizer, lambda step: 1.0)
