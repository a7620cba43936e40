"""One pass of an eval unit over a reader: the same code scores validation during training,
``eval`` and ``predict``, so their metrics agree to the last bit on the same model and rows."""

from __future__ import annotations

from typing import Any

import torch

from recipes.errors import UserError
from recipes.training.data_reader import DataError
from recipes.training.precision import Autocast
from recipes.training.predictions import PredictionCollector
from recipes.training.protocols import Predictor, Validation


def evaluate(
    validation: Validation[Any], autocast: Autocast, predictions: PredictionCollector | None = None
) -> dict[str, float]:
    """Score every batch of one pass of ``validation.reader``; its metrics, reduced over the unit's gang.

    With ``predictions``, the unit's ``predict`` runs instead of its call, and each step's outputs
    are collected (every rank yields the same number of steps, some of them empty).
    """
    unit = validation.unit
    predictor = unit if isinstance(unit, Predictor) else None
    if predictions is not None and predictor is None:
        raise UserError(
            f"The eval unit '{unit.name}' ({type(unit).__name__}) must have a `predict(batch)` method to write "
            "predictions, but has none."
        )
    num_steps = 0
    with torch.no_grad():
        for batches in validation.reader:
            num_steps += 1
            outputs = []
            for batch in batches:
                with autocast():
                    if predictions is None:
                        unit(batch)
                    else:
                        assert predictor is not None
                        outputs.append(predictor.predict(batch))
            if predictions is not None:
                predictions.add_step(outputs)
    validation.reader.reset()
    if num_steps == 0:  # Every rank reads as many steps: all raise, or none.
        raise DataError(
            "The evaluation data reader yields no step: the data must hold at least one row, but is empty (a split "
            "by value whose bounds no row falls within, say)."
        )
    values = unit.metric_bag.compute()
    unit.metric_bag.reset()
    return values
