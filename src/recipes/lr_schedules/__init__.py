"""The learning-rate schedules the ``lr_scheduler`` section chooses by name; a package may add its own.

The built-in ones warm up linearly over ``num_warmup_steps``, then keep the rate (``constant.py``), or
decay it to ``final_lr_scale`` times the rate at ``trainer.max_num_steps`` along a cosine or a line
(``decay.py``). Each is a module of this folder that registers it in ``LR_SCHEDULES`` by decorator (see
:mod:`recipes.lr_schedules.lr_schedule`); every module here is imported with the package, so a new
built-in schedule is a new module and nothing else; another package offers its own through the
entry-point group ``recipes.lr_schedules``.
"""

from components import import_submodules
from recipes.lr_schedules.lr_schedule import LR_SCHEDULES, LRScheduleConfig, LRScheduleFactory, build_lr_scheduler

import_submodules(__name__, __path__)

__all__ = ["LR_SCHEDULES", "LRScheduleConfig", "LRScheduleFactory", "build_lr_scheduler"]
