"""How many distinct ids the training files look up in each table: what ``dim_by_cardinality`` sizes tables by
(``recsys.zoo``).

The ids are those of the batches a reader of every training row makes, so every format, vocabulary and hashing
counts alike, and a fixed table's count is of its rows (values that share a hashed row count once). Counted in
one pass at the first start and saved in the output directory, whole or not at all: a resumed run, ``eval`` and
``predict`` load the counts instead, so that the tables they build are the ones trained, even after the training
files were appended to.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence

import fsspec
import numpy as np

from recipes import DataError
from recsys.click.batch import CTRBatch
from recsys.models.embeddings import TableSpec
from recsys.tabular.vocabulary import KeyCounter, write_whole

logger = logging.getLogger(__name__)


def count_table_ids(steps: Iterable[list[CTRBatch]], tables: Sequence[TableSpec]) -> dict[str, int]:
    """The distinct ids each table looks up over the batches of ``steps`` (every feature of a shared table)."""
    counters = {table.name: KeyCounter() for table in tables}
    for step in steps:
        for batch in step:
            for table in tables:
                for feature in table.features:
                    ids = batch.sparse[feature].ids.numpy()
                    counters[table.name].add(ids.view(np.uint64))
    return {name: len(counter.totals().keys) for name, counter in counters.items()}


def count_feature_ids(steps: Iterable[list[CTRBatch]], feature: str) -> tuple[np.ndarray, np.ndarray]:
    """The distinct ids of ``feature`` over the batches of ``steps``, sorted, and how many rows hold each."""
    counter = KeyCounter()
    for step in steps:
        for batch in step:
            counter.add(batch.sparse[feature].ids.numpy().view(np.uint64))
    totals = counter.totals()
    order = np.argsort(totals.keys.view(np.int64), kind="stable")
    return totals.keys.view(np.int64)[order], totals.counts[order]


def load_or_count_cardinalities(
    path: str, tables: Sequence[TableSpec], count: Callable[[], Mapping[str, int]]
) -> dict[str, int]:
    """The distinct ids of every table: those saved at ``path`` (any fsspec URL), or else ``count()``, saved there."""
    fs, plain_path = fsspec.core.url_to_fs(path)
    names = [table.name for table in tables]
    if fs.exists(plain_path):
        with fs.open(plain_path, "r") as file:
            saved = json.load(file)
        missing = [name for name in names if name not in saved]
        if missing:
            raise DataError(
                f"The ids of every table must be counted in {path}, but those of {', '.join(missing)} are not; use a "
                "new output directory to count anew."
            )
        logger.info("Loaded the tables' counted ids from %s.", path)
        return {name: int(saved[name]) for name in names}
    counted = {name: int(value) for name, value in count().items()}
    logger.info(
        "Distinct ids the training files look up, by table: %s.",
        ", ".join(f"{name} {counted[name]:,}" for name in names),
    )
    write_whole(path, json.dumps(counted, indent=1).encode())
    return counted
