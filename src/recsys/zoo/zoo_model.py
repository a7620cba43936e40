"""The zoo's registry: models by name, each with its own config, built over a recipe's tables and features.

A user comparing models on their data wants the baselines every CTR toolkit has, under one config
key, on the same tables and data path: a new model is then a one-word change, not a recipe. A
package adds its own model by registering it in ``ZOO_MODELS`` (by decorator, or through the
``recipes.zoo_models`` entry points).

Every model maps a ``CTRBatch`` to one logit per sample, ``[B]`` (``[B, T]`` for T tasks), with either backend of
``recsys.models.embeddings``; the framework finds and steps the sparse tables at any depth. A
model with MLPs says how they split over tensor-parallel ranks (``tensor_parallel_plan``). Most
models pool every feature; a model whose config says it ``reads_sequences`` (``din``) takes the
behaviour sequences of a schema's ``sequence`` columns as they come, jagged.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, ClassVar

import torch
from torch import nn

from components import PositiveInt, Range, Registry
from gang import Gang
from recipes import ConfigError
from recsys.click.tasks import Task
from recsys.models.embeddings import EmbeddingSection, TableSpec, build_embeddings

FIRST_ORDER_PREFIX = "first_order_"
"""Names the dim-1 tables of first-order weights apart from the feature vectors' tables of the same features."""


@dataclass
class ZooEmbeddingSection(EmbeddingSection):
    """The tables of a zoo model, which may size each table apart (models that concatenate vectors only)."""

    dim_by_cardinality: bool = False
    """Size each table by the distinct ids the training files look up in it, C: ``min(dim, round(6 * C ** 0.25))``
    dims (DeepCTR's ``auto`` rule, capped at ``dim``), so that a field of a handful of values does not get as
    many dims as one of millions. The ids are counted in one pass over the training files at the first start and
    saved in the output directory (``cardinalities.json``), so a resumed run, ``eval`` and ``predict`` build the
    same tables. For ``dcn_v2``, ``mlp`` and ``wide_deep``, whose vectors may differ in width."""
    table_dims: dict[str, PositiveInt] = field(default_factory=dict)
    """A table's own dim, by table name (a categorical column's, or its ``shared_table``'s), over ``dim`` and
    ``dim_by_cardinality``. For the same models."""

    @property
    def sizes_apart(self) -> bool:
        return self.dim_by_cardinality or bool(self.table_dims)


def cardinality_dim(cardinality: int, max_dim: int) -> int:
    """DeepCTR's ``embedding_dim="auto"`` (``6 * C ** 0.25``), at least 1 and at most ``max_dim``."""
    return max(1, min(max_dim, round(6 * math.sqrt(math.sqrt(cardinality)))))


def check_table_dims(section: ZooEmbeddingSection, tables: Sequence[TableSpec]) -> None:
    """Refuses ``table_dims`` that name no table: a recipe calls it before its first pass over the data."""
    names = {t.name for t in tables}
    unknown = sorted(set(section.table_dims) - names)
    if unknown:
        raise ConfigError(
            f"`model.embeddings.table_dims` must name the model's tables ({', '.join(sorted(names))}), but names "
            f"{', '.join(unknown)} instead."
        )


def sized_tables(
    section: ZooEmbeddingSection, tables: Sequence[TableSpec], cardinalities: Mapping[str, int] | None
) -> list[TableSpec]:
    """``tables``, each with the dim the section gives it (``cardinalities``: the counted distinct ids by table)."""
    check_table_dims(section, tables)
    names = {t.name for t in tables}
    if section.dim_by_cardinality and (cardinalities is None or not names <= set(cardinalities)):
        raise ValueError("`cardinalities` must count the ids of every table when dims are by cardinality, but do not.")
    sized = []
    for table in tables:
        dim = section.dim
        if section.dim_by_cardinality and cardinalities is not None:
            dim = cardinality_dim(cardinalities[table.name], section.dim)
        sized.append(replace(table, dim=section.table_dims.get(table.name, dim)))
    return sized


@dataclass
class ZooModelConfig:
    """The ``model`` section of a click-prediction recipe whose model is chosen by name.

    The defaults aim at one epoch over a small file: dropout in every deep MLP, layers no wider than
    such data supports, and the tables' own optimizer settings (see ``embeddings``).
    """

    reads_sequences: ClassVar[bool] = False
    """Whether the model reads behaviour sequences (tables that do not pool), which every other model refuses."""
    needs_sequence: ClassVar[bool] = False
    """Whether the model reads nothing without a behaviour sequence (``din``, ``sasrec``)."""

    multi_task: ClassVar[bool] = False
    """Whether the model gives one output per task (``num_tasks`` of ``ModelInputs``) for several tasks: a model
    whose last layer is a linear head, shared by the tasks up to it, or one built for several tasks (``mmoe``)."""

    min_tasks: ClassVar[int] = 1
    """The fewest tasks the model learns: 2 for the models whose parts are the tasks' (experts and gates shared by
    task towers, ESMM's two towers), which one label would leave without a reason to be."""

    name: str = "dcn_v2"
    """Which model; DCN-v2 by default, among the strongest on public CTR benchmarks (BARS, SIGIR 2022)."""
    embeddings: ZooEmbeddingSection = field(default_factory=ZooEmbeddingSection)
    """The features' tables, and, for ``logistic_regression``, ``fm``, ``deepfm`` and ``wide_deep``, their dim-1
    first-order weights (named ``first_order_<table>``, zero at first, on the same backend and optimizer). Table L2
    (``sparse_optimizer.weight_decay``) is off by default: it acts only on the rows a step touches, so a decay
    that reaches the rare ids that overfit crushes the frequent ones (on MovieLens, 1e-4 moved valid AUC < 0.001,
    1e-3 cost 0.008), unless ``weight_decay_by_frequency`` divides it by each row's steps, as the public-format
    presets do. With ``backend: dense`` the tables are dense parameters, which the ``optimizer`` section decays."""

    def check_tasks(self, tasks: Sequence[Task]) -> None:
        """Refuses tasks the model cannot learn (a ``ConfigError`` of one line); every task, unless a model says."""


class OneDimTables:
    """Refuses tables sized apart, for the configs of models whose vectors meet in dot products (or that have
    none): the dims would not fit, or would size nothing."""

    name: str
    embeddings: ZooEmbeddingSection

    def __post_init__(self) -> None:
        if self.embeddings.sizes_apart:
            key = "dim_by_cardinality" if self.embeddings.dim_by_cardinality else "table_dims"
            raise ValueError(
                f"`model.embeddings.{key}` must be used with a model whose vectors may differ in width (dcn_v2, "
                f"mlp, wide_deep), but model '{self.name}' has tables of one dim only."
            )


@dataclass
class DeepModelConfig(ZooModelConfig):
    """A model with a deep MLP: ``mlp``, the deep part of ``deepfm``, ``dcn_v2`` and ``wide_deep``, DLRM's top MLP,
    whose last linear layer gives one output per task."""

    multi_task: ClassVar[bool] = True

    hidden_dims: list[PositiveInt] = field(default_factory=lambda: [256, 128])
    """The deep MLP's hidden layers."""
    dropout: Annotated[float, Range(ge=0, lt=1)] = 0.2
    """Dropout after every hidden layer of the deep MLP, in [0, 1): the usual guard of deep CTR models against
    memorising rare ids (neutral on MovieLens, which one epoch does not overfit)."""


@dataclass(frozen=True)
class ModelInputs:
    """What a zoo model is built over: the tables, the features in model order, the dense features' count,
    the gang its sparse tables are sharded over, the seed of its initial values, its number of tasks (one logit per
    sample ``[B]`` for one, one per task ``[B, num_tasks]`` for several), and the sequence features with the most
    ids a row of each holds (their tables do not pool)."""

    tables: Sequence[TableSpec]
    features: list[str]
    num_dense: int
    gang: Gang
    seed: int
    num_tasks: int = 1
    sequence_lengths: Mapping[str, int] = field(default_factory=dict)
    tasks: tuple[Task, ...] = ()
    """The tasks by name and kind, in output order, where the caller knows them (a model that must tell its tasks
    apart, ``esmm``, needs them); empty: ``num_tasks`` alone."""

    def vectors(self, section: EmbeddingSection) -> nn.Module:
        """The features' vectors: one table per ``TableSpec``, of its own dim."""
        return build_embeddings(section, self.tables, self.gang, self.seed)

    def dims_by_feature(self, section: EmbeddingSection) -> dict[str, int]:
        """Each feature's vector width, by feature."""
        return dict(zip(self.features, self.feature_dims(section), strict=True))

    def feature_dims(self, section: EmbeddingSection) -> list[int]:
        """The width of each feature's vector, in ``features``' order."""
        dims = {feature: section.dim if t.dim is None else t.dim for t in self.tables for feature in t.features}
        return [dims[feature] for feature in self.features]

    def first_order(self, section: EmbeddingSection) -> nn.Module:
        """Dim-1 weights per id, from zero, beside the vectors' tables (named apart by ``FIRST_ORDER_PREFIX``)."""
        return build_embeddings(
            section, self.tables, self.gang, self.seed, dim=1, prefix=FIRST_ORDER_PREFIX, init_scale=0.0
        )


ZooModelFactory = Callable[[Any, ModelInputs], nn.Module]
"""``factory(config, inputs)``: the model, configured by its own config dataclass."""

ZOO_MODELS: Registry[ZooModelFactory] = Registry("zoo model", "recipes.zoo_models", ZooModelConfig)


def build_zoo_model(
    config: ZooModelConfig,
    tables: Sequence[TableSpec],
    features: Sequence[str],
    num_dense: int,
    gang: Gang,
    seed: int,
    cardinalities: Mapping[str, int] | None = None,
    num_tasks: int = 1,
    sequence_lengths: Mapping[str, int] | None = None,
    tasks: Sequence[Task] = (),
) -> nn.Module:
    """The model ``config.name`` over ``features`` (in this order, each looked up by one of ``tables``) and
    ``num_dense`` dense features, on ``gang.device``; its sparse tables are sharded over ``gang``, each of the
    dim ``config.embeddings`` gives it (``cardinalities``: the distinct ids the training files look up in each
    table, which ``dim_by_cardinality`` needs), with an output per task for ``num_tasks`` > 1. ``sequence_lengths``:
    the features that are sequences, with the most ids a row of each holds, which the tables that look them up do
    not pool. ``tasks``: the tasks themselves, where known (``num_tasks`` is then their number).

    The dense layers are initialised from ``seed`` alone, as the tables are, so that a model is the
    same whatever ran before it.
    """
    features, sequence_lengths = list(features), dict(sequence_lengths or {})
    _check_features(tables, features)
    _check_sequences(config, tables, sequence_lengths)
    if num_dense < 0:
        raise ValueError(f"`num_dense` must be >= 0, but is {num_dense} instead.")
    if tasks and len(tasks) != num_tasks:
        raise ValueError(f"`num_tasks` must be the number of `tasks` ({len(tasks)}), but is {num_tasks} instead.")
    check_num_tasks(config, num_tasks, tasks)
    factory = ZOO_MODELS.get(config.name).value
    with torch.random.fork_rng(devices=[]):  # The dense layers are built on the CPU; CUDA's stream stays.
        torch.default_generator.manual_seed(seed)
        sized = sized_tables(config.embeddings, tables, cardinalities)
        inputs = ModelInputs(sized, features, num_dense, gang, seed, num_tasks, sequence_lengths, tuple(tasks))
        model = factory(config, inputs)
    return model.to(gang.device)


def check_num_tasks(config: ZooModelConfig, num_tasks: int, tasks: Sequence[Task] = ()) -> None:
    """Refuses several tasks for a model with one output (its config's ``multi_task`` is false), fewer than a
    multi-task model's ``min_tasks``, and ``tasks`` the config's ``check_tasks`` refuses: a recipe calls it before
    its first pass over the data."""
    if num_tasks < type(config).min_tasks:
        raise ConfigError(
            f"The model '{config.name}' learns several tasks at once, so the data must have at least "
            f"{type(config).min_tasks} tasks (`dataset.labels`), but have {num_tasks} instead."
        )
    if tasks:
        config.check_tasks(tasks)
    if num_tasks > 1 and not type(config).multi_task:
        able = sorted(name for name in ZOO_MODELS.names() if ZOO_MODELS.get(name).config_class.multi_task)
        raise ConfigError(
            f"`dataset.labels` names {num_tasks} tasks, so the model must give an output per task ({', '.join(able)}), "
            f"but '{config.name}' gives one."
        )


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


def _check_sequences(config: ZooModelConfig, tables: Sequence[TableSpec], sequence_lengths: dict[str, int]) -> None:
    """A sequence is read by a model that reads sequences, from a table that does not pool, and the other way round."""
    unpooled = {feature for table in tables if table.pooling == "none" for feature in table.features}
    pooled = sorted(set(sequence_lengths) - unpooled)
    if pooled:
        raise ValueError(f"The sequences must be looked up by tables that do not pool, but {pooled} are not.")
    if sequence_lengths and not config.reads_sequences:
        readers = sorted(name for name in ZOO_MODELS.names() if ZOO_MODELS.get(name).config_class.reads_sequences)
        raise ConfigError(
            f"The model '{config.name}' pools every feature, so it cannot read the sequence "
            f"{', '.join(sorted(sequence_lengths))}: choose a model that reads sequences ({', '.join(readers)}), or "
            "declare its group `multi_hot: true` instead of `sequence: true`."
        )
    if config.needs_sequence and not sequence_lengths:
        raise ConfigError(
            f"The model '{config.name}' reads behaviour sequences, so a categorical group must be a `sequence`, but "
            "none is."
        )


def stack_fields(pooled: Mapping[str, torch.Tensor], features: list[str]) -> torch.Tensor:
    """The features' pooled vectors as ``[B, F, dim]``."""
    return torch.stack([pooled[name] for name in features], dim=1)
