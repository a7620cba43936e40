"""Vocabularies of categorical columns (the frequent values of the training files each get an id of their own),
and the value counts of ``count`` and ``count_before`` columns (how many training rows hold a value: its
popularity; for ``count_before``, also when each of them was).

Hashing gives every value a row whatever its count, so rare values share rows with frequent
ones at random; a vocabulary gives the ``num_buckets - 2`` most frequent values seen at least
``min_count`` times their own rows, and every other value one shared out-of-vocabulary row, as
DeepCTR's and FuxiCTR's feature encoders do. Id 0 stays the missing value's, id 1 is the
out-of-vocabulary id, the kept values get ids from 2 in order of falling count (ties: by key).

Both are counted in one pass over the training files at the first start and saved in the output
directory (whole or not at all); a resumed run, ``eval`` and ``predict`` load them instead of
counting again, so that ids and counts never change under a run whose files were appended to.
Values are known by their 64-bit keys (``recsys.tabular.hashing``), so no text is held.
"""

from __future__ import annotations

import io
import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import fsspec
import numba
import numpy as np
import numpy.typing as npt

from recipes import DataError
from recsys.tabular.hashing import bucket_ids
from recsys.tabular.history import History
from recsys.tabular.leave_one_out import EventRanks
from recsys.tabular.schema import COUNTS, TabularDataSection

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


@dataclass(frozen=True)
class ValueCounts:
    """How many training rows hold each value of a column, by the value's key (sorted); with ``orders``, the
    split-column values of those rows too, grouped by key in ``keys``' order and sorted within each key."""

    keys: npt.NDArray[np.uint64]
    counts: npt.NDArray[np.int64]
    orders: npt.NDArray[np.float64] | None = None

    def lookup(
        self, keys: npt.NDArray[np.uint64], orders: npt.NDArray[np.float64] | None = None
    ) -> npt.NDArray[np.float64]:
        """The counts of ``keys`` (0 for a value no training row holds, NaN for a missing value, key 0); given
        the rows' ``orders``, only the training rows of each key that come before the row are counted."""
        counts = np.zeros(len(keys), np.float64)
        if len(self.keys):
            at = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
            found = self.keys[at] == keys
            if orders is None or self.orders is None:
                counts = np.where(found, self.counts[at], 0).astype(np.float64)
            else:
                ends = np.cumsum(self.counts)
                counts = _counts_before(self.orders, ends - self.counts, ends, at, found, orders)
        counts[keys == 0] = np.nan
        return counts


@numba.njit(cache=True)
def _counts_before(sorted_orders, starts, ends, at, found, orders):  # type: ignore[no-untyped-def]
    """Per row, how many of its key's orders (``sorted_orders[starts[at]:ends[at]]``) are below its order."""
    counts = np.zeros(len(at), np.float64)
    for row in range(len(at)):
        if found[row]:
            low, high = starts[at[row]], ends[at[row]]
            counts[row] = np.searchsorted(sorted_orders[low:high], orders[row])
    return counts


@dataclass(frozen=True)
class Encodings:
    """What the first start counts over the training files: vocabularies and value counts, by column; and the
    histories (``recsys.tabular.history``) and a leave-one-out split's events (``recsys.tabular.leave_one_out``),
    gathered at each start over every configured file."""

    vocabularies: dict[str, Vocabulary]
    counts: dict[str, ValueCounts]
    histories: dict[str, History] = field(default_factory=dict)
    ranks: EventRanks | None = None


class KeyCounter:
    """Counts the keys of one column over many chunks, merging as it goes so memory follows distinct keys;
    ``ordered`` keeps every row's order as well (memory then follows the rows: 16 bytes each)."""

    def __init__(self, ordered: bool = False) -> None:
        self._keys: list[npt.NDArray[np.uint64]] = []
        self._counts: list[npt.NDArray[np.int64]] = []
        self._pending = 0
        self._ordered = ordered
        self._orders: list[npt.NDArray[np.float64]] = []

    def add(self, keys: npt.NDArray[np.uint64], orders: npt.NDArray[np.float64] | None = None) -> None:
        if self._ordered != (orders is not None):
            raise ValueError(f"`orders` must be given exactly when the counter is ordered ({self._ordered}).")
        if orders is not None:
            self._keys.append(keys.copy())
            self._orders.append(orders.astype(np.float64))
            return
        unique, counts = np.unique(keys, return_counts=True)
        self._keys.append(unique)
        self._counts.append(counts.astype(np.int64))
        self._pending += len(unique)
        if self._pending > 4 * max(len(self._keys[0]), 1 << 20):
            self._merge()

    def totals(self) -> ValueCounts:
        if self._ordered:
            keys = np.concatenate(self._keys) if self._keys else np.zeros(0, np.uint64)
            orders = np.concatenate(self._orders) if self._orders else np.zeros(0, np.float64)
            by_key_and_order = np.lexsort((orders, keys))
            unique, counts = np.unique(keys[by_key_and_order], return_counts=True)
            return ValueCounts(unique, counts.astype(np.int64), orders[by_key_and_order])
        self._merge()
        if not self._keys:
            return ValueCounts(np.zeros(0, np.uint64), np.zeros(0, np.int64))
        return ValueCounts(self._keys[0], self._counts[0])

    def _merge(self) -> None:
        if len(self._keys) < 2:
            return
        keys, inverse = np.unique(np.concatenate(self._keys), return_inverse=True)
        counts = np.bincount(inverse, weights=np.concatenate(self._counts), minlength=len(keys)).astype(np.int64)
        self._keys, self._counts, self._pending = [keys], [counts], len(keys)


def load_or_build_encodings(
    path: str, schema: TabularDataSection, count_values: Callable[[], Mapping[str, ValueCounts]]
) -> Encodings:
    """The vocabularies and value counts the schema asks for: those saved at ``path``, or else built from
    ``count_values()`` (one pass over the training files, keyed by vocabulary column and ``count`` or
    ``count_before`` column) and saved there."""
    wanted = {
        name: (group.min_count, group.num_buckets)
        for group in schema.categorical
        if group.vocabulary
        for name in group.columns
    }
    counted = {d.name: d.transform == "count_before" for d in schema.derived if d.transform in COUNTS}
    if not wanted and not counted:
        return Encodings({}, {})
    saved = load_encodings(path, wanted, counted)
    if saved is not None:
        logger.info("Loaded the vocabularies and counts of %s from %s.", ", ".join([*wanted, *counted]), path)
        return saved
    totals = count_values()
    vocabularies = {}
    for name, (min_count, num_buckets) in wanted.items():
        vocabularies[name] = Vocabulary.from_counts(totals[name].keys, totals[name].counts, min_count, num_buckets)
        log_vocabulary(name, vocabularies[name], totals[name].keys, totals[name].counts)
    counts = {name: totals[name] for name in counted}
    encodings = Encodings(vocabularies, counts)
    save_encodings(path, encodings)
    return encodings


def save_encodings(path: str, encodings: Encodings) -> None:
    """Write ``encodings`` to ``path`` (any fsspec URL) under a temporary name, then rename it."""
    arrays: dict[str, npt.NDArray[np.generic]] = {}
    for name, vocabulary in encodings.vocabularies.items():
        arrays[f"{name}/keys"] = vocabulary.keys
        arrays[f"{name}/ids"] = vocabulary.ids
        arrays[f"{name}/settings"] = np.array([vocabulary.min_count, vocabulary.num_buckets], np.int64)
    for name, counts in encodings.counts.items():
        arrays[f"{name}/count_keys"] = counts.keys
        arrays[f"{name}/counts"] = counts.counts
        if counts.orders is not None:
            arrays[f"{name}/count_orders"] = counts.orders
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    write_whole(path, buffer.getvalue())


def write_whole(path: str, payload: bytes) -> None:
    """Write ``payload`` to ``path`` (any fsspec URL) under a temporary name, then rename it: a reader sees the
    whole file or none. Every rank writes the same file, each through a temporary of its own."""
    fs, plain_path = fsspec.core.url_to_fs(path)
    temporary = f"{plain_path}.{uuid.uuid4().hex}.tmp"
    with fs.open(temporary, "wb") as file:
        file.write(payload)
    fs.mv(temporary, plain_path)


def column_ids(
    keys: npt.NDArray[np.uint64], column: str, num_buckets: int, encodings: Encodings | None
) -> npt.NDArray[np.int64]:
    """The ids the readers give the values of ``column`` with these ``keys``: vocabulary ranks where the column has
    a vocabulary, else rows of ``num_buckets`` (0: the full keys, for a hash table)."""
    if encodings is not None and column in encodings.vocabularies:
        return encodings.vocabularies[column].lookup(keys)
    return bucket_ids(keys, num_buckets)


def load_encodings(path: str, wanted: dict[str, tuple[int, int]], counted: dict[str, bool]) -> Encodings | None:
    """The encodings saved at ``path`` (None if there are none), checked to be those of the config: ``wanted``
    maps a vocabulary column to its ``(min_count, num_buckets)``, ``counted`` maps each ``count`` column to
    False and each ``count_before`` column to True."""
    fs, plain_path = fsspec.core.url_to_fs(path)
    if not fs.exists(plain_path):
        return None
    with fs.open(plain_path, "rb") as file, np.load(io.BytesIO(file.read())) as arrays:
        saved = set(arrays.files)
        vocabularies = {}
        for name, (min_count, num_buckets) in wanted.items():
            settings = arrays[f"{name}/settings"].tolist() if f"{name}/settings" in saved else None
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
        counts = {}
        for name, ordered in counted.items():
            if f"{name}/counts" not in saved or (ordered and f"{name}/count_orders" not in saved):
                raise DataError(
                    f"The {'ordered ' if ordered else ''}counts of `{name}` must be saved in {path} with the "
                    "vocabularies, as the config counts it, but are not; use a new output directory to count anew."
                )
            orders = arrays[f"{name}/count_orders"] if ordered else None
            counts[name] = ValueCounts(arrays[f"{name}/count_keys"], arrays[f"{name}/counts"], orders)
    return Encodings(vocabularies, counts)


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
