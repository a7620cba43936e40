"""The zoo's registry: models by name, each with its own config, built over a recipe's tables and features.

A user comparing models on their data wants the baselines every CTR toolkit has, under one config
key, on the same tables and data path: a new model is then a one-word change, not a recipe. A
package adds its own model by registering it in ``ZOO_MODELS`` (by decorator, or through the
``recipes.zoo_models`` entry points).

Every model maps a ``CTRBatch`` to one logit per sample, ``[B]``, with either backend of
``recsys.models.embeddings``; the framework finds and steps the sparse tables at any depth. A
model with MLPs says how they split over tensor-parallel ranks (``tensor_parallel_plan``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

import torch
from torch import nn

from components import PositiveInt, Range, Registry
from gang import Gang
from recsys.models.embeddings import EmbeddingSection, TableSpec, build_embeddings

FIRST_ORDER_PREFIX = "first_order_"
"""Names the dim-1 tables of first-order weights apart from the feature vectors' tables of the same features."""


@dataclass
class ZooModelConfig:
    """The ``model`` section of a click-prediction recipe whose model is chosen by name.

    The defaults aim at one epoch over a small file: dropout in every deep MLP, layers no wider than
    such data supports, and the tables' own optimizer settings (see ``embeddings``).
    """

    name: str = "dcn_v2"
    """Which model; DCN-v2 by default, among the strongest on public CTR benchmarks (BARS, SIGIR 2022)."""
    embeddings: EmbeddingSection = field(default_factory=EmbeddingSection)
    """The features' tables, and, for ``logistic_regression``, ``fm``, ``deepfm`` and ``wide_deep``, their dim-1
    first-order weights (named ``first_order_<table>``, zero at first, on the same backend and optimizer). Table L2
    (``sparse_optimizer.weight_decay``) is off by default: it acts only on the rows a step touches, so a decay
    that reaches the rare ids that overfit crushes the frequent ones (on MovieLens, 1e-4 moved valid AUC < 0.001,
    1e-3 cost 0.008), unless ``weight_decay_by_frequency`` divides it by each row's steps, as the public-format
    presets do. With ``backend: dense`` the tables are dense parameters, which the ``optimizer`` section decays."""


@dataclass
class DeepModelConfig(ZooModelConfig):
    """A model with a deep MLP: ``mlp``, the deep part of ``deepfm``, ``dcn_v2`` and ``wide_deep``, DLRM's top MLP."""

    hidden_dims: list[PositiveInt] = field(default_factory=lambda: [256, 128])
    """The deep MLP's hidden layers."""
    dropout: Annotated[float, Range(ge=0, lt=1)] = 0.2
    """Dropout after every hidden layer of the deep MLP, in [0, 1): the usual guard of deep CTR models against
    memorising rare ids (neutral on MovieLens, which one epoch does not overfit)."""


@dataclass(frozen=True)
class ModelInputs:
    """What a zoo model is built over: the tables, the features in model order, the dense features' count,
    the gang its sparse tables are sharded over, and the seed of its initial values."""

    tables: Sequence[TableSpec]
    features: list[str]
    num_dense: int
    gang: Gang
    seed: int

    def vectors(self, section: EmbeddingSection) -> nn.Module:
        """The features' vectors: one table per ``TableSpec``, of the section's dim."""
        return build_embeddings(section, self.tables, self.gang, self.seed)

    def first_order(self, section: EmbeddingSection) -> nn.Module:
        """Dim-1 weights per id, from zero, beside the vectors' tables (named apart by ``FIRST_ORDER_PREFIX``)."""
        return build_embeddings(
            section, self.tables, self.gang, self.seed, dim=1, prefix=FIRST_ORDER_PREFIX, init_scale=0.0
        )


ZooModelFactory = Callable[[Any, ModelInputs], nn.Module]
"""``factory(config, inputs)``: the model, configured by its own config dataclass."""

ZOO_MODELS: Registry[ZooModelFactory] = Registry("zoo model", "recipes.zoo_models", ZooModelConfig)


def build_zoo_model(
    config: ZooModelConfig, tables: Sequence[TableSpec], features: Sequence[str], num_dense: int, gang: Gang, seed: int
) -> nn.Module:
    """The model ``config.name`` over ``features`` (in this order, each looked up by one of ``tables``) and
    ``num_dense`` dense features, on ``gang.device``; its sparse tables are sharded over ``gang``.

    The dense layers are initialised from ``seed`` alone, as the tables are, so that a model is the
    same whatever ran before it.
    """
    features = list(features)
    _check_features(tables, features)
    if num_dense < 0:
        raise ValueError(f"`num_dense` must be >= 0, but is {num_dense} instead.")
    factory = ZOO_MODELS.get(config.name).value
    with torch.random.fork_rng(devices=[]):  # The dense layers are built on the CPU; CUDA's stream stays.
        torch.default_generator.manual_seed(seed)
        model = factory(config, ModelInputs(tables, features, num_dense, gang, seed))
    return model.to(gang.device)


def _check_features(tables: Sequence[TableSpec], features: list[str]) -> None:
    """A feature no table looks up would fail at the first batch; one no model input uses would train nothing."""
    looked_up = [feature for table in tables for feature in table.features]
    if not features:
        raise ValueError("`features` must name at least one feature, but is empty instead.")
    if len(set(features)) != len(features):
        raise ValueError(f"`features` must name each feature once, but is {features} instead.")
    if set(features) != set(looked_up):
        raise ValueError(
            f"`features` must be the features the tables look up ({', '.join(sorted(looked_up))}), "
            f"but is {', '.join(features)} instead."
        )


def stack_fields(pooled: Mapping[str, torch.Tensor], features: list[str]) -> torch.Tensor:
    """The features' pooled vectors as ``[B, F, dim]``."""
    return torch.stack([pooled[name] for name in features], dim=1)
