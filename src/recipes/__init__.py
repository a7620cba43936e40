"""The framework: what ``python -m recipes`` needs to train any recipe, and the API a recipe is written against.

A recipe (a user's, or a built-in one) imports what it needs from here,
never from the modules behind it, which may move. The names load on first use: ``python -m
recipes`` must size numba's thread pool before anything imports numba, and ``import recipes``
would otherwise import the whole framework first.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from recipes.config.presets import register_preset, register_recipe
    from recipes.config.resolution import (
        ConfigError,
        NonNegativeFloat,
        NonNegativeInt,
        PositiveFloat,
        PositiveInt,
        Range,
    )
    from recipes.config.sections import RecipeConfig, Seed
    from recipes.errors import UserError
    from recipes.runtime.threads import parse_threads
    from recipes.serving.servable import DenseForServing, ItemVectors, PooledInput, SequenceInput, ServableModel
    from recipes.training.batch_size import GlobalBatchSize
    from recipes.training.data_reader import DataError, DataReader
    from recipes.training.parallel import TensorParallelModel, megatron_mlp_plan
    from recipes.training.parts import ReaderOptions, RecipeContext, RecipeParts, per_rank_batch_size, reader_options
    from recipes.training.protocols import Predictor, Validation

_EXPORTS = {
    "GlobalBatchSize": "recipes.training.batch_size",
    "ConfigError": "recipes.config.resolution",
    "NonNegativeFloat": "recipes.config.resolution",
    "NonNegativeInt": "recipes.config.resolution",
    "PositiveFloat": "recipes.config.resolution",
    "PositiveInt": "recipes.config.resolution",
    "Range": "recipes.config.resolution",
    "DataError": "recipes.training.data_reader",
    "DataReader": "recipes.training.data_reader",
    "UserError": "recipes.errors",
    "DenseForServing": "recipes.serving.servable",
    "ItemVectors": "recipes.serving.servable",
    "PooledInput": "recipes.serving.servable",
    "SequenceInput": "recipes.serving.servable",
    "ServableModel": "recipes.serving.servable",
    "TensorParallelModel": "recipes.training.parallel",
    "megatron_mlp_plan": "recipes.training.parallel",
    "ReaderOptions": "recipes.training.parts",
    "RecipeContext": "recipes.training.parts",
    "RecipeParts": "recipes.training.parts",
    "per_rank_batch_size": "recipes.training.parts",
    "reader_options": "recipes.training.parts",
    "Predictor": "recipes.training.protocols",
    "Validation": "recipes.training.protocols",
    "register_preset": "recipes.config.presets",
    "register_recipe": "recipes.config.presets",
    "RecipeConfig": "recipes.config.sections",
    "Seed": "recipes.config.sections",
    "parse_threads": "recipes.runtime.threads",
}

__all__ = [
    "ConfigError",
    "DataError",
    "DataReader",
    "DenseForServing",
    "GlobalBatchSize",
    "ItemVectors",
    "NonNegativeFloat",
    "NonNegativeInt",
    "PooledInput",
    "PositiveFloat",
    "PositiveInt",
    "Predictor",
    "Range",
    "ReaderOptions",
    "RecipeConfig",
    "RecipeContext",
    "RecipeParts",
    "Seed",
    "SequenceInput",
    "ServableModel",
    "TensorParallelModel",
    "UserError",
    "Validation",
    "megatron_mlp_plan",
    "parse_threads",
    "per_rank_batch_size",
    "reader_options",
    "register_preset",
    "register_recipe",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'recipes' has no attribute '{name}'")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
