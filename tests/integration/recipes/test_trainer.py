"""Early stopping as a recipe's config sets it, through the CLI: patience counts the validations that fail to
beat the best score (the Trainer's loop itself: tests/unit/recipes/test_trainer.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from recipes.cli.main import main
from recipes.config.presets import register_preset, register_recipe
from recipes.config.sections import RecipeConfig
from recipes.training.parts import RecipeContext, RecipeParts
from support.linear_regression import (
    SquaredErrorUnit,
    linear_model,
    reader,
    sequence_validation,
)

# Early stopping through the config, in a recipe -------------------------------------------------


@dataclass
class SequenceDataSection:
    scores: list[float] = field(default_factory=list)


@dataclass
class SequenceConfig(RecipeConfig):
    data: SequenceDataSection = field(default_factory=SequenceDataSection)


def build_sequence_recipe(context: RecipeContext[SequenceConfig]) -> RecipeParts:
    model = linear_model()
    return RecipeParts(
        train_unit=SquaredErrorUnit(model),
        train_reader=reader(batch_size=8),
        validations=[sequence_validation(model, context.config.data.scores)],
    )


def test_trainer_early_stopping_patience_in_the_config_stops_training(
    isolated_presets: Path, read_jsonl: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    register_recipe("score_sequence", SequenceConfig)(build_sequence_recipe)
    register_preset(
        "score_sequence",
        "score_sequence",
        {
            # The score is a Mean, which does not say which way is better.
            "trainer": {
                "max_num_steps": 40,
                "validate_every_n_steps": 5,
                "score_metric": "score",
                "lower_better": False,
            },
            "optimizer": {"name": "sgd", "lr": 0.01},
            "metrics": {"recorders": {"console": False, "tensorboard": False}},
        },
    )

    code = main(
        [
            "train",
            "score_sequence",
            "-o",
            "out",
            "data.scores=[0.1, 0.3, 0.2, 0.25, 0.29, 0.9, 0.9, 0.9]",
            "trainer.early_stopping.patience=3",
        ]
    )

    assert code == 0, capsys.readouterr().err
    valid = read_jsonl(isolated_presets / "out" / "metrics" / "valid.jsonl")
    assert [row["step"] for row in valid] == [5, 10, 15, 20, 25]  # 0.2, 0.25, 0.29 fail to beat 0.3
    assert read_jsonl(isolated_presets / "out" / "metrics" / "train.jsonl")[-1]["step"] == 25
