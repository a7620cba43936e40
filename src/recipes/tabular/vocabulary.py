"""Vocabularies of categorical columns: the frequent values of the training files each get an id of their own.

Hashing gives every value a row whatever its count, so rare values share rows with frequent
ones at random; a vocabulary gives the ``num_buckets - 2`` most frequent values seen at least
``min_count`` times their own rows, and every other value one shared out-of-vocabulary row, as
DeepCTR's and FuxiCTR's feature encoders do. Id 0 stays the missing value's, id 1 is the
out-of-vocabulary id, the kept values get ids from 2 in order of falling count (ties: by key).

A vocabulary is counted in one pass over the training files at the first start and saved in
the output directory (whole or not at all); a resumed run, ``eval`` and ``predict`` load it
instead of counting again, so that ids never change under a run whose files were appended to.
Values are known by their 64-bit keys (``recipes.tabular.hashing``), so no text is held.
"""

from __future__ import annotations

import io
import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import fsspec
import numpy as np
import numpy.typing as npt

from recipes.data.reader import DataError
from recipes.tabular.schema import TabularDataSection

logger = logging.getLogger(__name__)

MISSING_ID, OUT_OF_VOCABULARY_ID = 0, 1


@dataclass(frozen=True)
class Vocabulary:
    """The kept keys of one column, sorted, and their ids; built with ``min_count`` and ``num_buckets``."""

    keys: npt.NDArray[np.uint64]
    ids: npt.NDArray[np.int64]
    min_count: int
    num_buckets: int

    @classmethod
    def from_counts(
        cls, keys: npt.NDArray[np.uint64], counts: npt.NDArray[np.int64], min_count: int, num_buckets: int
    ) -> Vocabulary:
        """Keep the values seen ``min_count`` times or more, the most frequent first, ``num_buckets - 2`` at most."""
        seen = (keys != 0) & (counts >= min_count)
        keys, counts = keys[seen], counts[seen]
        order = np.lexsort((keys, -counts))[: num_buckets - 2]
        kept = keys[order]
        by_key = np.argsort(kept)
        return cls(kept[by_key], (2 + by_key).astype(np.int64), min_count, num_buckets)

    def __len__(self) -> int:
        return len(self.keys)

    def lookup(self, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        """The ids of ``keys``: 0 for a missing value (key 0), 1 for a value out of the vocabulary."""
        if not len(self.keys):
            return np.where(keys == 0, MISSING_ID, OUT_OF_VOCABULARY_ID).astype(np.int64)
        at = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        ids = np.where(self.keys[at] == keys, self.ids[at], OUT_OF_VOCABULARY_ID)
        ids[keys == 0] = MISSING_ID
        return ids


class KeyCounter:
    """Counts the keys of one column over many chunks, merging as it goes so memory follows distinct keys."""

    def __init__(self) -> None:
        self._keys: list[npt.NDArray[np.uint64]] = []
        self._counts: list[npt.NDArray[np.int64]] = []
        self._pending = 0

    def add(self, keys: npt.NDArray[np.uint64]) -> None:
        unique, counts = np.unique(keys, return_counts=True)
        self._keys.append(unique)
        self._counts.append(counts.astype(np.int64))
        self._pending += len(unique)
        if self._pending > 4 * max(len(self._keys[0]), 1 << 20):
            self._merge()

    def totals(self) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64]]:
        self._merge()
        if not self._keys:
            return np.zeros(0, np.uint64), np.zeros(0, np.int64)
        return self._keys[0], self._counts[0]

    def _merge(self) -> None:
        if len(self._keys) < 2:
            return
        keys, inverse = np.unique(np.concatenate(self._keys), return_inverse=True)
        counts = np.bincount(inverse, weights=np.concatenate(self._counts), minlength=len(keys)).astype(np.int64)
        self._keys, self._counts, self._pending = [keys], [counts], len(keys)


KeyCounts = Mapping[str, tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64]]]


def load_or_build_vocabularies(
    path: str, schema: TabularDataSection, count_values: Callable[[], KeyCounts]
) -> dict[str, Vocabulary]:
    """The vocabularies of the schema's vocabulary columns: those saved at ``path``, or else built from
    ``count_values()`` (one pass over the training files) and saved there."""
    wanted = {
        name: (group.min_count, group.num_buckets)
        for group in schema.categorical
        if group.vocabulary
        for name in group.columns
    }
    if not wanted:
        return {}
    saved = load_vocabularies(path, wanted)
    if saved is not None:
        logger.info("Loaded the vocabularies of %s from %s.", ", ".join(wanted), path)
        return saved
    counts = count_values()
    vocabularies = {}
    for name, (min_count, num_buckets) in wanted.items():
        vocabularies[name] = Vocabulary.from_counts(*counts[name], min_count, num_buckets)
        log_vocabulary(name, vocabularies[name], *counts[name])
    save_vocabularies(path, vocabularies)
    return vocabularies


def save_vocabularies(path: str, vocabularies: dict[str, Vocabulary]) -> None:
    """Write ``vocabularies`` to ``path`` (any fsspec URL) under a temporary name, then rename it."""
    arrays: dict[str, npt.NDArray[np.generic]] = {}
    for name, vocabulary in vocabularies.items():
        arrays[f"{name}/keys"] = vocabulary.keys
        arrays[f"{name}/ids"] = vocabulary.ids
        arrays[f"{name}/settings"] = np.array([vocabulary.min_count, vocabulary.num_buckets], np.int64)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    fs, plain_path = fsspec.core.url_to_fs(path)
    temporary = f"{plain_path}.{uuid.uuid4().hex}.tmp"  # Every rank writes the same file: each its own temporary.
    with fs.open(temporary, "wb") as file:
        file.write(buffer.getvalue())
    fs.mv(temporary, plain_path)


def load_vocabularies(path: str, wanted: dict[str, tuple[int, int]]) -> dict[str, Vocabulary] | None:
    """The vocabularies saved at ``path`` (None if there are none), checked to be those of the config:
    ``wanted`` maps a column to its ``(min_count, num_buckets)``."""
    fs, plain_path = fsspec.core.url_to_fs(path)
    if not fs.exists(plain_path):
        return None
    with fs.open(plain_path, "rb") as file, np.load(io.BytesIO(file.read())) as arrays:
        saved = {key.split("/")[0] for key in arrays.files}
        vocabularies = {}
        for name, (min_count, num_buckets) in wanted.items():
            settings = arrays[f"{name}/settings"].tolist() if name in saved else None
            if settings != [min_count, num_buckets]:
                raise DataError(
                    f"The vocabulary of `{name}` saved in {path} must have been built with min_count={min_count} "
                    f"and num_buckets={num_buckets} as the config says, but "
                    + ("was not built" if settings is None else f"has {settings[0]} and {settings[1]}")
                    + " instead; use a new output directory to build the vocabularies anew."
                )
            vocabularies[name] = Vocabulary(
                arrays[f"{name}/keys"], arrays[f"{name}/ids"], int(min_count), int(num_buckets)
            )
    return vocabularies


def log_vocabulary(
    name: str, vocabulary: Vocabulary, keys: npt.NDArray[np.uint64], counts: npt.NDArray[np.int64]
) -> None:
    values = int((keys != 0).sum())
    rows = int(counts[keys != 0].sum())
    covered = int(counts[np.isin(keys, vocabulary.keys)].sum())
    logger.info(
        "Vocabulary of `%s`: %d of %d distinct values kept (seen at least %d times, at most %d), covering %.1f%% "
        "of its non-empty training values.",
        name,
        len(vocabulary),
        values,
        vocabulary.min_count,
        vocabulary.num_buckets - 2,
        100.0 * covered / max(rows, 1),
    )
