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
    from recipes.batch_size import GlobalBatchSize
    from recipes.config import (
        ConfigError,
        NonNegativeFloat,
        NonNegativeInt,
        PositiveFloat,
        PositiveInt,
        Range,
    )
    from recipes.data_reader import DataError, DataReader
    from recipes.errors import UserError
    from recipes.export_model import DenseForServing, PooledInput, ServableModel
    from recipes.parallel import TensorParallelModel, megatron_mlp_plan
    from recipes.parts import ReaderOptions, RecipeContext, RecipeParts, per_rank_batch_size, reader_options
    from recipes.protocols import Predictor, Validation
    from recipes.registry import register_preset, register_recipe
    from recipes.sections import RecipeConfig, Seed
    from recipes.threads import parse_threads

_EXPORTS = {
    "GlobalBatchSize": "recipes.batch_size",
    "ConfigError": "recipes.config",
    "NonNegativeFloat": "recipes.config",
    "NonNegativeInt": "recipes.config",
    "PositiveFloat": "recipes.config",
    "PositiveInt": "recipes.config",
    "Range": "recipes.config",
    "DataError": "recipes.data_reader",
    "DataReader": "recipes.data_reader",
    "UserError": "recipes.errors",
    "DenseForServing": "recipes.export_model",
    "PooledInput": "recipes.export_model",
    "ServableModel": "recipes.export_model",
    "TensorParallelModel": "recipes.parallel",
    "megatron_mlp_plan": "recipes.parallel",
    "ReaderOptions": "recipes.parts",
    "RecipeContext": "recipes.parts",
    "RecipeParts": "recipes.parts",
    "per_rank_batch_size": "recipes.parts",
    "reader_options": "recipes.parts",
    "Predictor": "recipes.protocols",
    "Validation": "recipes.protocols",
    "register_preset": "recipes.registry",
    "register_recipe": "recipes.registry",
    "RecipeConfig": "recipes.sections",
    "Seed": "recipes.sections",
    "parse_threads": "recipes.threads",
}

__all__ = [
    "ConfigError",
    "DataError",
    "DataReader",
    "DenseForServing",
    "GlobalBatchSize",
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
