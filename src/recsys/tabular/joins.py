"""Side tables joined to the rows by key: the attributes of the items or users that the rows name.

A side table is read whole at start-up by pyarrow (CSV/TSV with a header or the options of its ``format``, or
Parquet, through fsspec), its rows grouped by key. Keys are the 64-bit hashes of their text
(``recsys.tabular.hashing``) under the basis of the rows' ``on`` column, so that a row's key, hashed by the
tokeniser where it lies, finds its side rows
with one binary search, and no text is held. A column the rows take is kept in the form its role needs:
value keys (a categorical value), numbers (a dense value, or the source of a derived column), or bags of value
keys (multi-hot: every value of every side row of the key, split by the group's ``separator``).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass

import fsspec
import numba
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from recipes import DataError
from recsys.tabular.hashing import text_keys
from recsys.tabular.schema import JoinedTable, resolve_path
from recsys.tabular.split_by_value import SplitByValue
from recsys.tabular.text_layout import UnreadableText

Bags = tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64]]
"""Value keys and the offsets of each row's values in them."""


@dataclass(frozen=True)
class ColumnUse:
    """What the rows do with a joined column: a single value's key, its number, or a bag of value keys."""

    keys: bool = False
    numbers: bool = False
    bags: bool = False
    separator: str | None = None
    """With ``bags``: what splits one field into several values."""
    kind: str | None = None
    """The column whose values these are (``same_ids_as``), whose name their keys are hashed with; ``None``: this
    one's."""


class SideTable:
    """One joined table, held whole: its keys (sorted, unique) and each taken column's values per key."""

    def __init__(self, join: JoinedTable, uses: dict[str, ColumnUse], split: SplitByValue, key_kind: str) -> None:
        """``key_kind``: the column whose values the rows' keys are (``TabularDataSection.id_kind`` of ``join.on``),
        so that the table's keys hash as theirs do."""
        self.join = join
        self._path = join.path
        table = read_side_table(join, split)
        assert join.on is not None
        row_keys = text_keys(table.column(join.key), key_kind)
        order = np.argsort(row_keys, kind="stable")
        self.keys, starts = np.unique(row_keys[order], return_index=True)
        self._row_offsets = np.append(starts, len(order)).astype(np.int64)
        self._order = order
        self.keys_with_several_rows = np.diff(self._row_offsets) > 1
        self.single_keys: dict[str, npt.NDArray[np.uint64]] = {}
        self.numbers: dict[str, npt.NDArray[np.float64]] = {}
        self.bags: dict[str, Bags] = {}
        for name, use in uses.items():
            values = table.column(name)
            if use.keys or use.numbers:
                self._require_one_row_per_key(name, table)
            if use.keys:
                self.single_keys[name] = text_keys(values, use.kind or name)[order[starts]]
            if use.numbers:
                self.numbers[name] = side_numbers(self._path, name, values)[order[starts]]
            if use.bags:
                self.bags[name] = self._bags(name, values, use)

    def positions(self, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        """For each of ``keys``, the index of its entry among ``self.keys``, or -1 if the table lacks it."""
        if not len(self.keys):
            return np.full(len(keys), -1, np.int64)
        at = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        return np.where((self.keys[at] == keys) & (keys != 0), at, -1).astype(np.int64)

    def join_keys(self, keys: dict[str, npt.NDArray[np.uint64]]) -> npt.NDArray[np.int64]:
        """Adds to ``keys`` the keys of the single-valued columns the rows take (the missing key 0 where the table
        lacks a row's key), and returns ``positions`` of the rows' keys."""
        assert self.join.on is not None
        positions = self.positions(keys[self.join.on])
        for name, side_keys in self.single_keys.items():
            keys[name] = np.where(positions >= 0, side_keys[np.maximum(positions, 0)], np.uint64(0))
        return positions

    def _require_one_row_per_key(self, name: str, table: pa.Table) -> None:
        if self.keys_with_several_rows.any():
            first = int(self._order[self._row_offsets[int(np.argmax(self.keys_with_several_rows))]])
            key = table.column(self.join.key)[first].as_py()
            raise DataError(
                f"The column '{name}' of the joined table {self._path} must have one value per key, but key {key!r} "
                "has several rows: take it as a bag (`multi_hot: true` in its categorical group)."
            )

    def _bags(self, name: str, values: pa.ChunkedArray, use: ColumnUse) -> Bags:
        """Every value of every row of each key, split by the use's separator (a key's empty bag: the missing key
        0)."""
        texts = values.cast(pa.string()).fill_null("")
        kind = use.kind or name
        if use.separator is not None:
            lists = pc.split_pattern(texts, use.separator)
            lengths = pc.list_value_length(lists).to_numpy()
            value_keys = text_keys(pc.list_flatten(lists), kind)
        else:
            lengths, value_keys = np.ones(len(texts), np.int64), text_keys(texts, kind)
        value_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        grouped: Bags = _group_bags(value_keys, value_offsets, self._order, self._row_offsets)
        return grouped


def read_side_table(join: JoinedTable, split: SplitByValue) -> pa.Table:
    """The key and the taken columns as text, of the rows in the training range where the table holds the
    split column; a missing file or column is a one-line ``DataError``."""
    wanted = [join.key, *join.columns]
    path = join.path
    try:
        with fsspec.open(resolve_path(path), "rb", compression="infer") as file:
            data = file.read()
        if join.format is not None:
            table = join.format.read_side_table(data)
        elif path.endswith(".parquet"):
            table = pq.read_table(io.BytesIO(data))
        else:
            # Every column as text: a key or value means what its text says ("007" stays "007").
            delimiter = "\t" if path.removesuffix(".gz").endswith(".tsv") else ","
            header = data.split(b"\n", 1)[0].decode("utf-8-sig").rstrip("\r")
            names = next(csv.reader([header], delimiter=delimiter))
            table = pa_csv.read_csv(
                pa.py_buffer(data),
                parse_options=pa_csv.ParseOptions(delimiter=delimiter),
                convert_options=pa_csv.ConvertOptions(column_types=dict.fromkeys(names, pa.string())),
            )
    except FileNotFoundError:
        raise DataError(f"The joined table {path} must exist, but does not.") from None
    except UnreadableText as ex:
        raise DataError(f"The joined table {path} must be text as its `format` says, but is not: {ex}.") from None
    except (pa.ArrowException, OSError) as ex:
        raise DataError(
            f"The joined table {path} must be a readable CSV/TSV or Parquet file, but is not: {ex}"
        ) from None
    missing = [name for name in wanted if name not in table.column_names]
    if missing:
        raise DataError(
            f"The joined table {path} must have the column '{missing[0]}', but has {table.column_names} instead."
        )
    if split.column is not None and split.column in table.column_names:
        low, high = split.bounds("train") or (-np.inf, np.inf)
        values = side_numbers(path, split.column, table.column(split.column))
        table = table.filter(pa.array((values >= low) & (values < high)))
    return table.select(wanted)


def side_numbers(
    path: str, name: str, values: pa.ChunkedArray, table: str = "the joined table"
) -> npt.NDArray[np.float64]:
    """The column's numbers (NaN where empty or null); a text that is no number is a ``DataError`` naming ``table``
    and its ``path``."""
    if pa.types.is_integer(values.type) or pa.types.is_floating(values.type):
        return np.asarray(pc.cast(values, pa.float64()).fill_null(np.nan).to_numpy(), np.float64)
    texts = pc.utf8_trim_whitespace(values.cast(pa.string()))
    empty = pc.fill_null(pc.equal(texts, ""), True)
    try:
        numbers = pc.cast(pc.if_else(empty, None, texts), pa.float64())
    except pa.ArrowInvalid:
        bad = next(i for i, text in enumerate(texts.to_pylist()) if text and not _is_number(text))
        raise DataError(
            f"The column '{name}' of {table} {path} must hold numbers, but holds {texts[bad].as_py()!r} instead."
        ) from None
    return np.asarray(numbers.fill_null(np.nan).to_numpy(), np.float64)


def gather_bags(bags: Bags, positions: npt.NDArray[np.int64]) -> Bags:
    """The bag of each row's key (``positions`` from ``SideTable.positions``; -1: a bag of the missing key 0)."""
    values, offsets = bags
    gathered: Bags = _gather_bags(values, offsets, positions)
    return gathered


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


# Untyped, as numba compiles these for their arguments' types.
@numba.njit(cache=True)
def _group_bags(value_keys, value_offsets, order, row_offsets):  # type: ignore[no-untyped-def]
    """The values of the rows of each key (rows ``order[row_offsets[k]:row_offsets[k + 1]]``), concatenated,
    empty values dropped; a key with none gets the missing key 0."""
    num_keys = len(row_offsets) - 1
    offsets = np.zeros(num_keys + 1, np.int64)
    out = np.zeros(len(value_keys) + num_keys, np.uint64)
    size = 0
    for key in range(num_keys):
        first = size
        for r in range(row_offsets[key], row_offsets[key + 1]):
            row = order[r]
            for v in range(value_offsets[row], value_offsets[row + 1]):
                if value_keys[v] != 0:
                    out[size] = value_keys[v]
                    size += 1
        if size == first:
            size += 1  # out[size - 1] is 0: the missing value.
        offsets[key + 1] = size
    return out[:size], offsets


@numba.njit(cache=True)
def _gather_bags(values, offsets, positions):  # type: ignore[no-untyped-def]
    row_offsets = np.zeros(len(positions) + 1, np.int64)
    for row in range(len(positions)):
        p = positions[row]
        row_offsets[row + 1] = row_offsets[row] + (offsets[p + 1] - offsets[p] if p >= 0 else 1)
    out = np.zeros(row_offsets[-1], np.uint64)
    for row in range(len(positions)):
        p = positions[row]
        if p >= 0:
            out[row_offsets[row] : row_offsets[row + 1]] = values[offsets[p] : offsets[p + 1]]
    return out, row_offsets
