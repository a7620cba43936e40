"""The sparse optimizers by name, the config every one of them derives its own from, and the state
a table starts with.

Each sparse optimizer registers in :data:`SPARSE_OPTIMIZERS` its config (a frozen dataclass
deriving from :class:`SparseOptimizerConfig`, with its own fields only) and the function of that
config to its :class:`SparseOptimizerSpec`. A config names its optimizer, so whatever holds one
(a table, a collection, a recipe's config) takes any registered optimizer's, and finds its spec
with :func:`spec_of`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from components import Component, NonNegativeFloat, Registry
from embedding.optimizers.optimizer_spec import SparseOptimizerSpec


class SparseOptimizerError(ValueError):
    """Raised when a sparse optimizer is configured or called with invalid values."""


@dataclass(frozen=True)
class SparseOptimizerConfig:
    """The optimizer of an embedding table, applied lazily: rows not touched in a step keep
    their weight and state unchanged. What every sparse optimizer takes; each one's config adds
    its own fields and names it by default.

    The numbers are checked against the ranges their types declare, here for configs built in
    Python as the recipe config checks them for configs read from YAML.
    """

    name: str
    lr: NonNegativeFloat = 0.01
    """The tables' learning rate, which the LR schedule scales with the dense one; 0 freezes the table."""
    weight_decay: NonNegativeFloat = 0.0
    """An L2 penalty added to the gradient, unless the optimizer decouples it (``adamw``).

    It acts on the rows a step touches, only: an id seen in a thousand steps is decayed a
    thousand times, one seen once, once. A decay strong enough to restrain the rare ids, the
    ones that overfit on small data, crushes the frequent ones; see ``weight_decay_by_frequency``."""
    weight_decay_by_frequency: bool = False
    """Divide a row's decay by the number of steps that have touched it, this one included, so
    that an id's decay grows with the log of its count rather than with the count (DIN's
    mini-batch aware regularisation, with the counts kept as training goes rather than counted
    over the data first). The counts are one float per row, saved and resharded with the rest of
    the optimizer's state."""

    def __post_init__(self) -> None:
        SPARSE_OPTIMIZERS.check_config(self, SparseOptimizerError)
        if self.weight_decay_by_frequency and self.weight_decay == 0:
            raise SparseOptimizerError(
                "`weight_decay` must be greater than 0 when `weight_decay_by_frequency` is set, but is 0 instead."
            )


SpecOf = Callable[[Any], SparseOptimizerSpec]
"""What an optimizer registers: the function of its config to its spec."""

SPARSE_OPTIMIZERS: Registry[SpecOf] = Registry("sparse optimizer", "recipes.sparse_optimizers", SparseOptimizerConfig)
"""Every sparse optimizer by name: its config class and the function of that config to its spec.
The built-in ones register when :mod:`embedding` is imported; another package offers its own
through the entry-point group."""


def spec_of(config: SparseOptimizerConfig) -> SparseOptimizerSpec:
    """The spec of the optimizer that ``config`` configures, as ``config`` sets it."""
    spec = SPARSE_OPTIMIZERS.get(config.name).value(config)
    return replace(spec, counts_touches=True) if config.weight_decay_by_frequency else spec


def sparse_optimizer_config(name: str, **options: Any) -> SparseOptimizerConfig:
    """The config of optimizer ``name``, with ``options`` and its defaults for the rest."""
    config: SparseOptimizerConfig = _registered(name).config_class(name=name, **options)
    return config


def init_optimizer_state(
    config: SparseOptimizerConfig,
    num_rows: int,
    dim: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> dict[str, torch.Tensor]:
    """Return the fresh optimizer state of a ``[num_rows, dim]`` table, by state name."""
    if num_rows < 0 or dim < 0:
        raise SparseOptimizerError(
            f"`num_rows` and `dim` must be greater than or equal to 0, but are {num_rows} and {dim} instead."
        )
    return spec_of(config).fresh_state(num_rows, dim, dtype, device)


def _registered(name: str) -> Component[SpecOf]:
    if name not in SPARSE_OPTIMIZERS:
        raise SparseOptimizerError(
            f"`name` must be one of {', '.join(SPARSE_OPTIMIZERS.names())}, but is '{name}' instead."
        )
    return SPARSE_OPTIMIZERS.get(name)
