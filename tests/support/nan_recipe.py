"""A user recipe for the NaN tests: ``ctr`` whose loss is NaN at the steps ``nan.at_steps`` names.

The tests copy this file next to a ``recipes.yaml`` that imports it, as a user's own recipe
module would be found.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch

from recipes.config.presets import register_recipe
from recipes.training.parts import RecipeContext, RecipeParts
from recsys.builtin.ctr.recipe import CTRConfig, build_ctr
from recsys.click.batch import CTRBatch
from units import TrainUnit


@dataclass
class NanSection:
    at_steps: list[int] = field(default_factory=list)
    rank: int | None = None
    """Only this rank's loss is NaN (``None``: every rank's)."""


@dataclass
class NanCTRConfig(CTRConfig):
    nan: NanSection = field(default_factory=NanSection)


class NanAtStepsUnit(TrainUnit[CTRBatch]):
    """The ``ctr`` unit, with its loss multiplied by NaN at the chosen steps."""

    def __init__(self, unit: TrainUnit[CTRBatch], at_steps: list[int], rank: int | None) -> None:
        super().__init__(unit.model, unit.metric_bag)
        self._unit = unit
        self._at_steps = set(at_steps) if rank is None or rank == int(os.environ.get("RANK", "0")) else set()

    def __call__(self, batch: CTRBatch) -> torch.Tensor:
        self._unit.model = self.model  # The Trainer may have wrapped it.
        loss = self._unit(batch)
        if self.step_nr in self._at_steps:
            loss = loss * float("nan")
        return loss


@register_recipe("nan_ctr", NanCTRConfig, "ctr with a NaN loss at chosen steps.")
def build_nan_ctr(context: RecipeContext[Any]) -> RecipeParts:
    config: NanCTRConfig = context.config
    parts = build_ctr(context)
    parts.train_unit = NanAtStepsUnit(parts.train_unit, config.nan.at_steps, config.nan.rank)
    return parts
