"""A streaming reader of the raw Criteo click logs (Kaggle / Terabyte format).

Each line holds a label (0 or 1), 13 integer features and 26 categorical features written as
hexadecimal hashes, separated by tabs; any feature may be empty. The reader never holds more
than one bounded *window* of rows: it reads the files in chunks of bytes, parses a chunk's
lines at once with numpy, and collects well-formed rows until the window is full.

The reader is a ``recipes.data.stream.StreamingLineReader``: bounded shuffle windows, rows
sharded over the data-parallel ranks, exact resume, malformed lines logged and counted (see
there). What is Criteo's:

- Integer features become ``log(max(x, 0) + 1)`` as in DLRM; an empty one becomes 0.
- A categorical hash ``h`` becomes the id ``h % num_embeddings`` of its table; an empty one
  becomes the id 0 (which it shares with the hashes that are multiples of the table size).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from recipes.click.batch import CTRBatch, make_ctr_batch
from recipes.data.stream import ParsedLines, StreamingLineReader

NUM_DENSE_FEATURES = 13
NUM_SPARSE_FEATURES = 26
SPARSE_FEATURE_NAMES = tuple(f"cat_{i}" for i in range(NUM_SPARSE_FEATURES))
_NUM_FIELDS = 1 + NUM_DENSE_FEATURES + NUM_SPARSE_FEATURES
_MAX_HEX_DIGITS = 8
_MAX_INT_CHARS = 18  # A longer integer would not fit in an int64.

_HEX_VALUES = np.full(256, 255, dtype=np.uint8)
for _digit, _char in enumerate(b"0123456789abcdef"):
    _HEX_VALUES[_char] = _digit
    _HEX_VALUES[ord(chr(_char).upper())] = _digit


def parse_criteo_lines(buffer: bytes, table_sizes: npt.NDArray[np.int64]) -> ParsedLines:
    """Parses complete, newline-terminated lines at once (vectorised: no Python loop over rows)."""
    data = np.frombuffer(buffer, dtype=np.uint8)
    newlines = np.flatnonzero(data == ord("\n"))
    num_lines = len(newlines)
    line_starts = np.concatenate([[0], newlines[:-1] + 1]).astype(np.int64)

    tabs = np.flatnonzero(data == ord("\t"))
    tab_counts = np.bincount(np.searchsorted(newlines, tabs), minlength=num_lines)
    well_split = tab_counts == _NUM_FIELDS - 1
    rows = np.flatnonzero(well_split)
    field_tabs = tabs[np.repeat(well_split, tab_counts)].reshape(-1, _NUM_FIELDS - 1)
    # int32 offsets (a chunk is far below 2 GiB) halve the size of the per-character temporaries.
    starts = np.concatenate([line_starts[rows, None], field_tabs + 1], axis=1).astype(np.int32)
    ends = np.concatenate([field_tabs, newlines[rows, None]], axis=1).astype(np.int32)
    lengths = ends - starts

    label_chars = data[starts[:, 0]]
    label_ok = (lengths[:, 0] == 1) & ((label_chars == ord("0")) | (label_chars == ord("1")))
    dense_slice = slice(1, 1 + NUM_DENSE_FEATURES)
    dense, dense_ok = _parse_log_integers(data, starts[:, dense_slice], ends[:, dense_slice])
    sparse_slice = slice(1 + NUM_DENSE_FEATURES, _NUM_FIELDS)
    hashes, sparse_ok = _parse_hex(data, ends[:, sparse_slice], lengths[:, sparse_slice])
    ids = np.where(lengths[:, sparse_slice] == 0, 0, hashes % table_sizes)

    fields_ok = np.concatenate([label_ok[:, None], dense_ok, sparse_ok], axis=1)
    row_ok = fields_ok.all(axis=1)
    valid = np.zeros(num_lines, dtype=np.bool_)
    valid[rows[row_ok]] = True

    result_labels = np.zeros(num_lines, dtype=np.float32)
    result_labels[rows] = label_chars - ord("0")
    result_dense = np.zeros((num_lines, NUM_DENSE_FEATURES), dtype=np.float32)
    result_dense[rows] = dense
    result_sparse = np.zeros((num_lines, NUM_SPARSE_FEATURES), dtype=np.int64)
    result_sparse[rows] = ids
    problems = {
        int(line): f"it must have {_NUM_FIELDS} tab-separated fields, but has {tab_counts[line] + 1} instead"
        for line in np.flatnonzero(~well_split)
    }
    for row in np.flatnonzero(~row_ok):
        field = int(np.argmin(fields_ok[row]))
        text = bytes(data[starts[row, field] : ends[row, field]]).decode(errors="replace")
        problems[int(rows[row])] = _field_problem(field, text)
    return ParsedLines(newlines + 1, valid, (result_labels, result_dense, result_sparse), problems)


def _parse_log_integers(
    data: npt.NDArray[np.uint8], starts: npt.NDArray[np.int32], ends: npt.NDArray[np.int32]
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_]]:
    """``log(max(x, 0) + 1)`` of decimal integer fields (empty: 0), and which fields were valid."""
    lengths = ends - starts
    width = int(min(max(lengths.max(initial=0), 1), _MAX_INT_CHARS))
    offsets = np.arange(width)
    positions = ends[..., None] - width + offsets
    inside = offsets >= (width - lengths)[..., None]
    chars = data[np.maximum(positions, 0)]
    digits = chars - np.uint8(ord("0"))
    is_digit = digits < 10
    is_sign = (chars == ord("-")) & (positions == starts[..., None]) & (lengths >= 2)[..., None]
    valid = np.all(~inside | is_digit | is_sign, axis=-1) & (lengths <= _MAX_INT_CHARS)
    negative = np.any(inside & is_sign, axis=-1)
    powers = 10.0 ** np.arange(width - 1, -1, -1)
    values = np.where(inside & is_digit, digits, 0).astype(np.float64) @ powers
    return np.where(negative, 0.0, np.log1p(values)).astype(np.float32), valid


def _parse_hex(
    data: npt.NDArray[np.uint8], ends: npt.NDArray[np.int32], lengths: npt.NDArray[np.int32]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """The values of hexadecimal fields of up to 8 digits (empty: 0), and which fields were valid."""
    offsets = np.arange(_MAX_HEX_DIGITS)
    inside = offsets >= (_MAX_HEX_DIGITS - lengths)[..., None]
    nibbles = _HEX_VALUES[data[np.maximum(ends[..., None] - _MAX_HEX_DIGITS + offsets, 0)]]
    valid = np.all(~inside | (nibbles < 16), axis=-1) & (lengths <= _MAX_HEX_DIGITS)
    shifts = 4 * (_MAX_HEX_DIGITS - 1 - offsets)
    values = (np.where(inside, nibbles, 0).astype(np.uint32) << shifts.astype(np.uint32)).sum(axis=-1, dtype=np.int64)
    return values, valid


def _field_problem(field: int, text: str) -> str:
    if field == 0:
        return f"the label must be 0 or 1, but is {text!r} instead"
    if field <= NUM_DENSE_FEATURES:
        return f"integer feature {field - 1} must be a decimal integer or empty, but is {text!r} instead"
    name = SPARSE_FEATURE_NAMES[field - 1 - NUM_DENSE_FEATURES]
    return f"`{name}` must be a hexadecimal hash of at most 8 digits or empty, but is {text!r} instead"


class CriteoReader(StreamingLineReader[CTRBatch]):
    """Reads Criteo-format files (plain, or gzip by the ``.gz`` extension) from any fsspec path.

    ``num_embeddings_per_feature`` sizes the 26 tables the hashes are folded into: one int for
    all, or one per feature. The other arguments are ``StreamingLineReader``'s.
    """

    def __init__(
        self,
        paths: str | Sequence[str],
        *,
        batch_size: int,
        num_embeddings_per_feature: int | Sequence[int],
        **kwargs: Any,
    ) -> None:
        self._table_sizes = _table_sizes(num_embeddings_per_feature)
        super().__init__(paths, batch_size=batch_size, **kwargs)

    def parse(self, buffer: bytes, file_index: int, first_line: int) -> ParsedLines:
        return parse_criteo_lines(buffer, self._table_sizes)

    def make_batch(self, columns: tuple[npt.NDArray[Any], ...]) -> CTRBatch:
        return _make_batch(*columns)

    def empty_columns(self) -> tuple[npt.NDArray[Any], ...]:
        return (
            np.zeros(0, np.float32),
            np.zeros((0, NUM_DENSE_FEATURES), np.float32),
            np.zeros((0, NUM_SPARSE_FEATURES), np.int64),
        )


def _make_batch(
    labels: npt.NDArray[np.float32], dense: npt.NDArray[np.float32], sparse: npt.NDArray[np.int64]
) -> CTRBatch:
    batch_size = len(labels)
    offsets = np.arange(batch_size + 1, dtype=np.int64)
    features = {name: (sparse[:, i], offsets) for i, name in enumerate(SPARSE_FEATURE_NAMES)}
    return make_ctr_batch(dense, features, labels)


def _table_sizes(num_embeddings_per_feature: int | Sequence[int]) -> npt.NDArray[np.int64]:
    if isinstance(num_embeddings_per_feature, int):
        sizes = [num_embeddings_per_feature] * NUM_SPARSE_FEATURES
    else:
        sizes = list(num_embeddings_per_feature)
    if len(sizes) != NUM_SPARSE_FEATURES or min(sizes) < 1:
        raise ValueError(
            f"`num_embeddings_per_feature` must be a positive int or {NUM_SPARSE_FEATURES} positive ints, "
            f"but is {num_embeddings_per_feature} instead."
        )
    return np.asarray(sizes, dtype=np.int64)
