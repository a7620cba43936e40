"""The schema's columns that may group or slice the validation metrics, and readable names for slice ids.

A row's group or slice is its column's id in the batch (``recsys.click.metric_columns``): any single-valued
categorical column may play either role. How many values a column has is known before reading only for a
vocabulary (its size), so that a slice of too many values stops the run at start-up there, and at the first
validation elsewhere. Ids are hashes or frequency ranks, which say nothing to a reader of a dashboard; for a
derived time part (the hour, the weekday) every value is known, so its slices are named by their values.
"""

from __future__ import annotations

import numpy as np

from recsys.tabular.hashing import integer_keys
from recsys.tabular.schema import TabularDataSection
from recsys.tabular.vocabulary import Encodings, column_ids

TIME_PART_VALUES = {"hour": range(24), "weekday": range(7), "day": range(1, 32), "month": range(1, 13)}
"""The values of the derived time parts that have few (a year has any)."""


def single_valued_columns(schema: TabularDataSection, encodings: Encodings | None) -> dict[str, int | None]:
    """The single-valued categorical columns, each with the most ids it can have where known: a vocabulary's
    values, the out-of-vocabulary id and the missing value's; ``None`` for a hashed column."""
    groups = {name: group for group in schema.categorical for name in group.columns}
    vocabularies = {} if encodings is None else encodings.vocabularies
    return {
        name: len(vocabularies[name]) + 2 if name in vocabularies else None
        for name in schema.categorical_columns
        if not groups[name].multi_hot
    }


def value_names(
    schema: TabularDataSection, column: str, encodings: Encodings | None, full_keys: bool
) -> dict[int, str]:
    """The ids of a derived time part's values, named by the values (``13`` for 1 pm); values that share an id (in a
    hashed column of few buckets) name it together (``3_17``). Empty for any other column."""
    derived = next((d for d in schema.derived if d.name == column), None)
    group = next((group for group in schema.categorical if column in group.columns), None)
    if derived is None or derived.transform not in TIME_PART_VALUES or group is None:
        return {}
    values = np.array(TIME_PART_VALUES[derived.transform], dtype=np.float64)
    keys = integer_keys(values, schema.id_kind(column))
    ids = column_ids(keys, column, 0 if full_keys else group.num_buckets, encodings)
    names: dict[int, list[str]] = {}
    for value, id_ in zip(values.astype(np.int64).tolist(), ids.tolist()):
        names.setdefault(int(id_), []).append(str(value))
    return {id_: "_".join(texts) for id_, texts in names.items()}
