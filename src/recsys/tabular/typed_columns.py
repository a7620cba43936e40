"""Typed (Arrow) columns -> the rows of click-prediction batches, as a ``dataset`` schema gives each column a role.

A columnar file (Parquet) carries types, so unlike a text file's fields its values need no parsing; what
stays is to check at start-up that each column's type can play its role, and to make sure a value means
the same as it would in a CSV file:

- a label's ``positive``/``negative`` values are compared with the value's text (an int 1 is "1");
  with ``threshold``, or for a regression task (whose label is the number), the column must be numeric;
- dense columns are numbers (a null is ``fill``; NaN or infinity make the row malformed);
- a categorical value's *text* is hashed (an int as its decimal text, a string as it is, a null to id
  0), so that the same value gets the same id in a CSV and a Parquet file. A dictionary-encoded column
  has its dictionary hashed once (while it stays the same), not every row. A multi-hot column is a
  string holding ``separator``, or a list of strings or integers: a bag of ids per row (a null or empty
  bag holds the missing value's id 0, as an empty CSV field does).

Rows come out as ``TabularReader``'s do: ``(labels, dense, *categorical)``, float32 labels, the float32 dense
columns in schema order, then per categorical column its int64 ids, or for a multi-hot one an object
array of id bags. Whole columns are converted at once, by pyarrow's kernels and numba loops that read
Arrow's buffers in place (a dictionary's ids gathered, the dense columns checked, logged and stored in
one pass each), never row by row in Python.
"""

from __future__ import annotations

import re
from typing import Any

import numba
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from recsys.tabular.added_columns import AddedColumns, AddedValues, dense_column
from recsys.tabular.hashing import bucket_ids, hash_ids, text_keys
from recsys.tabular.labels import LabelTask
from recsys.tabular.row_arrays import object_array, split_rows
from recsys.tabular.schema import CategoricalColumns, TabularDataSection
from recsys.tabular.tokens import SMALL_COUNT_LOGS, log_count


def _value_type(type_: pa.DataType) -> pa.DataType:
    return type_.value_type if pa.types.is_dictionary(type_) else type_


def _is_text(type_: pa.DataType) -> bool:
    """Whether a value of this type has a text that hashes as a CSV field's would."""
    return bool(pa.types.is_string(type_) or pa.types.is_large_string(type_) or pa.types.is_integer(type_))


def _is_number(type_: pa.DataType) -> bool:
    return bool(pa.types.is_integer(type_) or pa.types.is_float32(type_) or pa.types.is_float64(type_))


class TypedRows:
    """Converts record batches holding the schema's columns into rows, noting the malformed ones; ``added``
    computes the joined and derived columns, and which rows the reader's split keeps."""

    def __init__(self, schema: TabularDataSection, added: AddedColumns) -> None:
        self._schema = schema
        self._added = added
        self._groups = {name: group for group in schema.categorical for name in group.columns}
        added_names = set(schema.added_columns)
        self.single_valued = [
            name for name in schema.categorical_columns if not self._groups[name].multi_hot and name not in added_names
        ]
        self.multi_hot = [name for name in schema.categorical_columns if self._groups[name].multi_hot]
        self._file_dense = [name for name in schema.dense_columns if name not in added_names]
        self._hashers = {
            name: _DictionaryHasher(schema.id_kind(name), self._groups[name].num_buckets) for name in self.single_valued
        }
        self._tasks = schema.label_tasks
        self._label_columns = list(dict.fromkeys(task.column for task in self._tasks))

    @property
    def columns(self) -> list[str]:
        """The file columns the schema reads, labels first."""
        added_names = set(self._schema.added_columns)
        used = [
            *self._label_columns,
            *self._file_dense,
            *(name for name in self._schema.categorical_columns if name not in added_names),
            *self._added.file_keys,
            *self._added.file_numbers,
        ]
        return list(dict.fromkeys(used))

    def type_problem(self, name: str, type_: pa.DataType) -> str | None:
        """What a column of this type lacks for the role the schema gives ``name``; None if it fits."""
        value_type = _value_type(type_)
        if name in self._added.file_numbers:
            fits, wanted = _is_number(value_type), "a number (a split column, or the source of a time part)"
        elif name in self._added.file_keys and name not in self._groups:
            fits, wanted = (
                _is_text(value_type),
                "a string or integer (a join key, the source of a count, or a key of the split)",
            )
        elif name in self._label_columns:
            numeric = [task for task in self._tasks if task.column == name and task.threshold is not None]
            numeric += [task for task in self._tasks if task.column == name and task.kind == "regression"]
            if numeric:
                fits, wanted = _is_number(value_type), "a number (for `threshold` or `kind: regression`)"
            else:
                fits, wanted = _is_text(value_type) or pa.types.is_boolean(value_type), "a string, integer or boolean"
        elif name in self._groups and self._groups[name].sequence and not self._groups[name].separator:
            is_list = pa.types.is_list(type_) or pa.types.is_large_list(type_)
            fits = is_list and _is_text(type_.value_type)
            wanted = "a list of strings or integers (a sequence), or a string holding `separator`"
        elif name in self._groups and not self._groups[name].multi_hot:
            fits, wanted = _is_text(value_type), "a string or integer (a list needs `multi_hot: true`)"
        elif name in self._groups:
            is_list = pa.types.is_list(type_) or pa.types.is_large_list(type_)
            fits = _is_text(value_type) or (is_list and _is_text(type_.value_type))
            wanted = "a string (holding `separator`), an integer, or a list of strings or integers"
        else:
            fits, wanted = _is_number(value_type), "an integer or floating-point number"
        return None if fits else f"must be {wanted}, but is {type_} instead"

    def dictionary_columns(self, types: dict[str, pa.DataType]) -> list[str]:
        """The single-valued categorical string columns, best read dictionary-encoded: their dictionary is
        hashed once instead of every row."""
        return [name for name in self.single_valued if pa.types.is_string(types[name])]

    def convert(
        self, batch: pa.RecordBatch
    ) -> tuple[tuple[npt.NDArray[Any], ...], dict[int, str], npt.NDArray[np.bool_] | None]:
        """The rows of ``batch`` as ``(labels, dense, *categorical)``, the first problem of each malformed row, and
        which rows the split keeps (``None``: all)."""
        problems: dict[int, str] = {}
        each = [self._labels(task, batch.column(task.column), problems) for task in self._tasks]
        labels = each[0] if len(each) == 1 else np.stack(each, axis=1)
        added = self._added_values(batch)
        dense = pooled_array((batch.num_rows, len(self._schema.dense_columns)), np.float32)
        index = 0
        for spec in self._schema.dense:
            for name in spec.columns:
                if name in added.numbers:
                    dense[:, index] = dense_column(added.numbers[name], spec.fill, spec.log)
                else:
                    values = _decoded(batch.column(name))
                    numbers, validity = _values_and_validity(values)
                    bad = _store_numbers(
                        numbers, validity, values.offset, spec.fill, spec.log, SMALL_COUNT_LOGS, dense, index
                    )
                    _note(problems, bad, values, f"`{name}` must be a finite number or null")
                index += 1
        # The file's own values first: a row they make malformed was left out of the pass over every row, and the
        # split would call it one that pass did not see.
        for row, problem in added.problems.items():
            problems.setdefault(row, problem)
        categorical = [self._categorical(name, batch, added) for name in self._schema.categorical_columns]
        return (labels, dense, *categorical), problems, added.keep

    def file_keys_and_numbers(
        self, batch: pa.RecordBatch
    ) -> tuple[dict[str, npt.NDArray[np.uint64]], dict[str, npt.NDArray[np.float64]]]:
        """The keys and numbers of the file columns that ``AddedColumns`` reads."""
        keys = {name: text_keys(batch.column(name), self._schema.id_kind(name)) for name in self._added.file_keys}
        numbers = {name: _floats(batch.column(name), np.nan) for name in self._added.file_numbers}
        return keys, numbers

    def _added_values(self, batch: pa.RecordBatch) -> AddedValues:
        if self._added.empty:
            return AddedValues()
        return self._added.apply(*self.file_keys_and_numbers(batch))

    def _categorical(self, name: str, batch: pa.RecordBatch, added: AddedValues) -> npt.NDArray[Any]:
        num_buckets = self._groups[name].num_buckets
        if name in added.bags:
            keys, offsets = added.bags[name]
            return split_rows(bucket_ids(keys, num_buckets), offsets, self._groups[name].max_len)
        if name in added.keys:
            return bucket_ids(added.keys[name], num_buckets)
        if name in self.multi_hot:
            return self._bags(name, batch.column(name))
        return self._hashers[name].ids(batch.column(name))

    def empty_rows(self) -> tuple[npt.NDArray[Any], ...]:
        """Rows of zero rows, with the shapes and dtypes ``convert`` gives."""
        categorical = [
            object_array([]) if name in self.multi_hot else np.zeros(0, np.int64)
            for name in self._schema.categorical_columns
        ]
        labels = np.zeros((0, len(self._tasks)) if len(self._tasks) > 1 else 0, np.float32)
        return (labels, np.zeros((0, len(self._schema.dense_columns)), np.float32), *categorical)

    def _labels(self, spec: LabelTask, values: pa.Array, problems: dict[int, str]) -> npt.NDArray[np.float32]:
        """One task's labels: a regression task's numbers, or a binary one's clicks."""
        if spec.threshold is not None or spec.kind == "regression":
            numbers = _floats(values, np.nan)
            _note(problems, ~np.isfinite(numbers), values, f"the label `{spec.column}` must be a finite number")
            if spec.kind == "regression":
                return np.where(np.isfinite(numbers), numbers, 0.0).astype(np.float32)
            assert spec.threshold is not None
            clicks: npt.NDArray[np.float32] = (numbers >= spec.threshold).astype(np.float32)
            return clicks
        values = _decoded(values)
        if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
            values = pc.utf8_trim_whitespace(values)
        positive = pc.is_in(values, value_set=_label_values(spec.positive, values.type)).to_numpy(zero_copy_only=False)
        negative = pc.is_in(values, value_set=_label_values(spec.negative, values.type)).to_numpy(zero_copy_only=False)
        allowed = ", ".join(repr(value) for value in [*spec.positive, *spec.negative])
        _note(problems, ~(positive | negative), values, f"the label `{spec.column}` must be one of {allowed}")
        clicks = positive.astype(np.float32)
        return clicks

    def _bags(self, name: str, values: pa.Array) -> npt.NDArray[Any]:
        group: CategoricalColumns = self._groups[name]
        values = _decoded(values)
        if not (pa.types.is_list(values.type) or pa.types.is_large_list(values.type)):
            texts = values.cast(pa.string()).fill_null("")
            values = (
                pc.split_pattern(texts, group.separator)
                if group.separator
                else pa.ListArray.from_arrays(np.arange(len(texts) + 1, dtype=np.int32), texts)
            )
        lengths = pc.list_value_length(values).fill_null(0).to_numpy(zero_copy_only=False)
        ids = hash_ids(values.flatten(), self._schema.id_kind(name), group.num_buckets)
        missing = np.zeros(1, np.int64)
        bags = split_rows(ids, np.concatenate([[0], np.cumsum(lengths)]), group.max_len)
        return object_array([bag if len(bag) else missing for bag in bags])


class _DictionaryHasher:
    """The ids of one categorical column's values; the ids of a dictionary-encoded column's dictionary are
    kept while the next batches bring the same dictionary (a Parquet row group's batches all do). The dictionary
    and its ids are kept as one pair, replaced whole, so that batches converted on several threads at once
    never take one dictionary's ids for another's."""

    def __init__(self, name: str, num_buckets: int) -> None:
        self._name, self._num_buckets = name, num_buckets
        self._dictionary_and_ids: tuple[pa.Array, npt.NDArray[np.int64]] | None = None

    def ids(self, values: pa.Array) -> npt.NDArray[np.int64]:
        if not isinstance(values, pa.DictionaryArray):
            return hash_ids(values, self._name, self._num_buckets)
        kept = self._dictionary_and_ids
        if kept is None or not values.dictionary.equals(kept[0]):
            kept = values.dictionary, hash_ids(values.dictionary, self._name, self._num_buckets)
            self._dictionary_and_ids = kept
        positions, validity = _values_and_validity(values.indices)
        ids = pooled_array((len(values),), np.int64)
        _gather(kept[1], positions, validity, values.indices.offset, ids)
        return ids


def pooled_array(shape: tuple[int, ...], dtype: type[np.generic]) -> npt.NDArray[Any]:
    """An uninitialised array in Arrow's memory pool, which keeps freed memory for the next batch's arrays:
    numpy's own allocations of this size go back to the system when freed, and each new one faults its
    pages in again (the largest cost of a gather, measured)."""
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return np.frombuffer(pa.allocate_buffer(size), dtype).reshape(shape)


def _values_and_validity(values: pa.Array) -> tuple[npt.NDArray[Any], npt.NDArray[np.uint8]]:
    """A primitive array's values, as numpy sees them (without a copy; a null's value means nothing), and
    its validity bitmap from bit ``values.offset`` on (empty if it has no nulls): for numba to read."""
    validity, data = values.buffers()[:2]
    dtype = values.type.to_pandas_dtype()
    numbers = np.frombuffer(data, dtype)[values.offset :][: len(values)] if data is not None else np.zeros(0, dtype)
    bitmap = np.frombuffer(validity, np.uint8) if values.null_count else np.zeros(0, np.uint8)
    return numbers, bitmap


# Untyped, as numba compiles these for their arguments' types.
@numba.njit(cache=True, nogil=True)
def _gather(table, indices, validity, offset, out):  # type: ignore[no-untyped-def]
    """``out[:] = table[indices]``, but 0 where Arrow's ``validity`` bitmap (from bit ``offset``; empty: no
    nulls) says an index is null; without numpy's conversion of the indices to intp, or a pass to fill nulls."""
    for row in range(len(indices)):
        bit = offset + row
        valid = len(validity) == 0 or (validity[bit >> 3] >> (bit & 7)) & 1
        out[row] = table[indices[row]] if valid else 0


@numba.njit(cache=True, nogil=True)
def _store_numbers(numbers, validity, offset, fill, log, small_count_logs, out, column):  # type: ignore[no-untyped-def]
    """Stores a column's numbers in ``out[:, column]`` (as ``log(max(x, 0) + 1)`` if ``log``), ``fill`` for those
    that ``validity`` says are null (see ``_gather``). Returns which rows hold a bad (non-finite) number."""
    bad = np.zeros(len(numbers), np.bool_)
    for row in range(len(numbers)):
        bit = offset + row
        value = np.float64(numbers[row]) if len(validity) == 0 or (validity[bit >> 3] >> (bit & 7)) & 1 else fill
        if not np.isfinite(value):
            bad[row] = True
            out[row, column] = 0.0
            continue
        out[row, column] = log_count(value, small_count_logs) if log else value
    return bad


def _label_values(texts: list[str], type_: pa.DataType) -> pa.Array:
    """The label values of ``texts`` in the column's type: an integer column's value matches a text that
    is its decimal text ("1", not "01" or "1.0"), a boolean's "true" or "false"; a string matches once
    trimmed (as a CSV field is)."""
    if pa.types.is_integer(type_):
        bounds = np.iinfo(type_.to_pandas_dtype())
        numbers = [int(text) for text in texts if re.fullmatch(r"0|-?[1-9][0-9]*", text)]
        return pa.array([number for number in numbers if bounds.min <= number <= bounds.max], type_)
    if pa.types.is_boolean(type_):
        return pa.array([text == "true" for text in texts if text in ("true", "false")], type_)
    return pa.array(texts, type_)


def _decoded(values: pa.Array) -> pa.Array:
    return values.dictionary_decode() if isinstance(values, pa.DictionaryArray) else values


def _floats(values: pa.Array, fill: float) -> npt.NDArray[np.float64]:
    """A numeric column as float64, nulls as ``fill`` (integers past 2**53 round, as a CSV's text would)."""
    numbers: npt.NDArray[np.float64] = (
        pc.cast(_decoded(values), pa.float64(), safe=False).fill_null(fill).to_numpy(zero_copy_only=False)
    )
    return numbers


def _note(problems: dict[int, str], bad: npt.NDArray[np.bool_], values: pa.Array, what: str) -> None:
    """Records the first problem of each bad row (a row keeps the problem found first)."""
    for row in np.flatnonzero(bad):
        if int(row) not in problems:
            problems[int(row)] = f"{what}, but is {values[int(row)].as_py()!r} instead"
