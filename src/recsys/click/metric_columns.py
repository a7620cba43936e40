"""Which sparse features of a click batch group (GAUC) and slice (NE, calibration) the validation metrics.

The framework's ``metrics.group_by`` and ``metrics.slice_by`` name columns; only a recipe knows what its
batches hold, so it hands ``metric_columns`` the single-valued sparse features that may play either role,
and a name that is not one of them stops the run at start-up in one line. A row's group or slice is the
feature's id in the batch: the value's own id with a vocabulary or hash (64-bit key) tables, its bucket with
hashed fixed-size tables (where two values may share one; give the column ample ``num_buckets``).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from recipes import ConfigError, RecipeConfig
from recsys.click.batch import CTRBatch
from units import MAX_SLICES


@dataclass(frozen=True)
class MetricColumns:
    """The feature whose ids group the rows for GAUC, the one whose ids slice them for NE and calibration (either
    may be ``None``), and names for the slice ids that have a readable one (the hour ``13``, not its bucket)."""

    group_by: str | None = None
    slice_by: str | None = None
    slice_names: Mapping[int, str] = field(default_factory=dict)


def metric_columns(
    config: RecipeConfig,
    columns: Mapping[str, int | None],
    slice_names: Mapping[int, str] | None = None,
) -> MetricColumns:
    """``config.metrics``' columns checked against ``columns``: the single-valued sparse features of the recipe's
    batches, each with its number of distinct values where the recipe knows it (a vocabulary's size) or ``None``.

    A slice column known to have more than ``MAX_SLICES`` values is refused now; one whose count is not known is
    counted as validation reads it.
    """
    metrics = config.metrics
    for key, name in (("group_by", metrics.group_by), ("slice_by", metrics.slice_by)):
        if name is not None and name not in columns:
            known = ", ".join(columns) or "none in this recipe"
            raise ConfigError(
                f"`metrics.{key}` must name a single-valued categorical column of the batches ({known}), but is "
                f"'{name}' instead.{_did_you_mean(name, columns)}"
            )
    size = None if metrics.slice_by is None else columns[metrics.slice_by]
    if size is not None and size > MAX_SLICES:
        raise ConfigError(
            f"`metrics.slice_by` must name a column of at most {MAX_SLICES} values, but '{metrics.slice_by}' has "
            f"{size}; group by it instead (`metrics.group_by`)."
        )
    return MetricColumns(metrics.group_by, metrics.slice_by, dict(slice_names or {}))


def row_ids(batch: CTRBatch, name: str) -> torch.Tensor:
    """The id of feature ``name`` in each row of ``batch``, which must hold one per row."""
    if name not in batch.sparse:
        raise ConfigError(
            f"`metrics.group_by` and `metrics.slice_by` must name a sparse feature of the validation batches "
            f"({', '.join(batch.sparse) or 'none'}), but '{name}' is not one.{_did_you_mean(name, batch.sparse)}"
        )
    feature = batch.sparse[name]
    if feature.ids.numel() != batch.batch_size:
        raise ConfigError(
            f"`metrics.group_by` and `metrics.slice_by` must name a single-valued feature, but '{name}' holds "
            f"{feature.ids.numel()} ids for {batch.batch_size} rows."
        )
    return feature.ids.detach().clone()


def _did_you_mean(name: str, candidates: Mapping[str, object]) -> str:
    matches = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f" Did you mean '{matches[0]}'?" if matches else ""
