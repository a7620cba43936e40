"""The ``movielens`` recipe: click-through prediction (rating >= 4) on MovieLens ml-latest-small."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import numpy.typing as npt
from torch import nn

from recipes.builtin.movielens.reader import NUM_DENSE_FEATURES, SPARSE_FEATURE_NAMES, MovieLensReader, load_movielens
from recipes.click.models import DLRM, CTRModel
from recipes.click.units import click_prediction_parts
from recipes.config import PositiveInt, Range
from recipes.models.embeddings import (
    EmbeddingSection,
    TableSpec,
    build_embeddings,
)
from recipes.parallel import tensor_parallel_mlp
from recipes.parts import RecipeContext, RecipeParts, reader_options
from recipes.registry import register_recipe
from recipes.sections import RecipeConfig

# Shipped as package data, so an installed package trains on it as a checkout does.
SHIPPED_DATA = str(Path(__file__).resolve().parent / "ml-latest-small")


@dataclass
class MovieLensDataSection:
    path: str | None = None
    """A folder (or fsspec URL) with ``ratings.csv`` and ``movies.csv``; ``None``: the shipped ml-latest-small
    (not its path, which differs between installs and would stop a run's resume elsewhere)."""
    split: Literal["time", "random"] = "time"
    """``time``: the latest ratings are the validation set; ``random``: a seeded random split."""
    valid_fraction: Annotated[float, Range(gt=0, lt=1)] = 0.2
    batch_size: PositiveInt = 512
    """The global batch size of a micro-batch, split evenly over the data-parallel ranks."""


@dataclass
class MovieLensModelSection:
    arch: Literal["dlrm", "mlp"] = "dlrm"
    """``dlrm``: dot-product interactions; ``mlp``: concatenated embeddings into an MLP."""
    embeddings: EmbeddingSection = field(default_factory=EmbeddingSection)
    bottom_dims: list[PositiveInt] = field(default_factory=lambda: [16])
    top_dims: list[PositiveInt] = field(default_factory=lambda: [64, 32])


@dataclass
class MovieLensConfig(RecipeConfig):
    model: MovieLensModelSection = field(default_factory=MovieLensModelSection)
    dataset: MovieLensDataSection = field(default_factory=MovieLensDataSection)


@register_recipe("movielens", MovieLensConfig, "CTR (rating >= 4) on MovieLens: users, movies, genres, time.")
def build_movielens(context: RecipeContext[MovieLensConfig]) -> RecipeParts:
    config, gangs = context.config, context.gangs
    data_section, section = config.dataset, config.model.embeddings
    data = load_movielens(data_section.path or SHIPPED_DATA)
    train_rows, valid_rows = data.split(data_section.split, data_section.valid_fraction, seed=config.seed)

    tables = [
        TableSpec(name, data.vocab_sizes[name], (name,), pooling="mean" if name == "genres" else "sum")
        for name in SPARSE_FEATURE_NAMES
    ]
    embeddings = build_embeddings(section, tables, gangs.dp, config.seed)
    features = list(SPARSE_FEATURE_NAMES)
    model: nn.Module
    if config.model.arch == "dlrm":
        model = DLRM(
            embeddings, features, NUM_DENSE_FEATURES, section.dim, config.model.bottom_dims, config.model.top_dims
        )
        tensor_parallel_mlp(model.top_mlp, gangs)
    else:
        model = CTRModel(embeddings, features, section.dim, NUM_DENSE_FEATURES, config.model.top_dims)
        tensor_parallel_mlp(model.mlp, gangs)
    model.to(context.device)

    def reader(rows: npt.NDArray[np.int64], train: bool) -> MovieLensReader:
        return MovieLensReader(data, rows, **reader_options(context, data_section.batch_size, train))

    return click_prediction_parts(context, model, reader(train_rows, train=True), reader(valid_rows, train=False))
