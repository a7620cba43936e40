"""What a recipe receives (``RecipeContext``) and returns (``RecipeParts``), and the standard parts.

A recipe builds only what is specific to it: model, units, data readers, and optionally its
optimizer. The framework adds the rest (LR scheduler, recorders, checkpoints, profiler,
early stopping) from the standard config sections.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypedDict, TypeVar

import torch
from torch import nn
from torch.optim import Optimizer

from gang import Gangs
from recipes.config.resolution import ConfigError
from recipes.config.sections import RecipeConfig
from recipes.errors import UserError
from recipes.training.data_reader import DataReader
from recipes.training.protocols import ShardedStateful, Validation
from units import EvalUnit, TrainUnit
from units.unit import ran_base_init

if TYPE_CHECKING:
    import pyarrow as pa

ConfigT = TypeVar("ConfigT", bound=RecipeConfig)


@dataclass(frozen=True)
class RecipeContext(Generic[ConfigT]):
    """The resolved config and the job's gangs and device, handed to a recipe's builder."""

    config: ConfigT
    gangs: Gangs
    device: torch.device
    output_dir: str


@dataclass
class RecipeParts:
    """The recipe-specific parts of a training job.

    ``validations`` run during training and score the ``valid`` split. ``splits`` holds the
    readers of further splits that ``eval`` and ``predict`` may be asked for (``test`` where the
    config names test data); they run the first validation's unit. Readers of scored splits
    must yield every row (no dropped partial step) so that metrics and predictions are exact.

    The framework finds the model's sparse tables itself: it steps them beside the dense
    optimizer and checkpoints them. ``make_optimizer`` and ``sharded_state`` are for special
    cases only, and must then cover every table. ``make_optimizer`` takes the model after data
    parallelism has wrapped or sharded it, because FSDP2 replaces the parameters an optimizer
    must hold; ``sharded_state`` names state split over ranks, for checkpoints.
    """

    train_unit: TrainUnit[Any]
    train_reader: DataReader[Any]
    validations: list[Validation[Any]] = field(default_factory=list)
    splits: dict[str, DataReader[Any]] = field(default_factory=dict)
    make_optimizer: Callable[[nn.Module], Optimizer] | None = None
    sharded_state: dict[str, ShardedStateful] = field(default_factory=dict)
    save_filter: Callable[[str], bool] | None = None
    """RecIS' ``save_filter_fn``: whether a checkpoint keeps a parameter (``mlp.0.weight``), a table
    (``embeddings.cat_0``) or a part of the run's state (``optimizer``), beside ``checkpoint.exclude``. A
    resume re-initialises the parameters and tables left out, and refuses a checkpoint without run state."""
    value_texts: Callable[[], Mapping[str, pa.Table]] | None = None
    """The texts behind the ids of sparse features whose ids are hashed or ranked from text, for ``export`` (a
    serving system given a row's text finds its ids there): per feature, a table of ``id`` (int64) and ``value``
    (string). Called by ``export`` only, so it may read the data."""


def check_units(parts: RecipeParts) -> None:
    """Each unit the recipe hands over is one, and ran its base class's ``__init__``: a subclass whose ``__init__``
    forgets ``super().__init__`` would fail only where the framework first reads its model, metric bag or name."""
    _check_unit(parts.train_unit, TrainUnit, "train_unit", "model, metric_bag")
    for index, validation in enumerate(parts.validations):
        _check_unit(validation.unit, EvalUnit, f"validations[{index}].unit", "model, metric_bag, name")


def _check_unit(unit: object, base: type[TrainUnit[Any]] | type[EvalUnit[Any]], where: str, arguments: str) -> None:
    kind = type(unit).__name__
    if not isinstance(unit, base):
        raise UserError(f"`RecipeParts.{where}` must be a {base.__name__}, but is a {kind} instead.")
    if not ran_base_init(unit):
        raise UserError(
            f"The {base.__name__} {kind} (`RecipeParts.{where}`) is not set up: its __init__ must call "
            f"`super().__init__({arguments})`."
        )


def per_rank_batch_size(global_batch_size: int, dp_size: int) -> int:
    """Each DP rank's share of a global batch; the same config then trains alike on any number of ranks. The key of
    a config field typed ``GlobalBatchSize`` is checked, and named, before the recipe builds (``job.build_parts``);
    this one does not know which key the recipe passes."""
    if global_batch_size % dp_size != 0:
        raise ConfigError(
            f"The train batch size must be a multiple of the {dp_size} data-parallel ranks, "
            f"but is {global_batch_size} instead."
        )
    return global_batch_size // dp_size


def per_rank_eval_batch_size(config: RecipeConfig, train_batch_size: int, dp_size: int) -> int:
    """Each DP rank's batch of validation, ``eval`` and ``predict``: ``validation.batch_size`` or the training one."""
    batch_size = config.validation.batch_size or train_batch_size
    if batch_size % dp_size != 0:
        raise ConfigError(
            f"`validation.batch_size` must be a multiple of the {dp_size} data-parallel ranks, "
            f"but is {batch_size} instead."
        )
    return batch_size // dp_size


class ReaderOptions(TypedDict):
    """The keyword arguments every sharded reader of this package takes, for one split."""

    batch_size: int
    num_accumulate: int
    dp_rank: int
    dp_size: int
    shuffle: bool
    seed: int
    drop_last: bool


def reader_options(context: RecipeContext[Any], global_batch_size: int, train: bool) -> ReaderOptions:
    """How a split is read: training shuffles, accumulates and drops a partial last step; validation,
    ``eval`` and ``predict`` read every row in order, at ``validation.batch_size`` if set."""
    config, dp = context.config, context.gangs.dp
    if train:
        batch_size = per_rank_batch_size(global_batch_size, dp.size)
    else:
        batch_size = per_rank_eval_batch_size(config, global_batch_size, dp.size)
    return ReaderOptions(
        batch_size=batch_size,
        num_accumulate=config.trainer.grad_accumulation if train else 1,
        dp_rank=dp.rank,
        dp_size=dp.size,
        shuffle=train,
        seed=config.seed,
        drop_last=train,
    )
