"""Click-prediction batches from delimited text files (CSV, TSV), as a ``dataset`` schema declares them.

pyarrow's CSV parser reads each chunk of whole lines (the streaming, shuffling, sharding and
resume are ``recipes.data.stream``'s); every selected column is read as text and converted
here, so that a bad field is reported with its file and line instead of failing the chunk.
CRLF line ends, quoted fields (without newlines inside) and gzip are handled; a header line is
checked against the schema and skipped.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

from recipes.click.batch import CTRBatch, make_ctr_batch
from recipes.data.reader import DataError
from recipes.data.stream import ParsedLines, StreamingLineReader
from recipes.tabular.hashing import hash_ids
from recipes.tabular.schema import CategoricalColumns, TabularDataSection

_NUMBER = r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$"


class TabularReader(StreamingLineReader[CTRBatch]):
    """Reads the files of ``paths`` as ``schema`` says; the other arguments are ``StreamingLineReader``'s.

    Batches hold the dense columns in schema order as ``dense``, one sparse feature per
    categorical column (named after it), and the label as 0/1.
    """

    def __init__(self, paths: str | Sequence[str], schema: TabularDataSection, **kwargs: Any) -> None:
        self._schema = schema
        super().__init__(paths, **kwargs)
        self._names = self._column_names()
        missing = [
            c for c in (schema.label.column, *schema.dense_columns, *schema.categorical_columns) if c not in self._names
        ]
        if missing:
            raise DataError(
                f"The schema's column '{missing[0]}' must be a column of {self.file_name(0)}, but the file's "
                f"columns are {self._names} instead."
            )
        self._groups = {name: group for group in schema.categorical for name in group.columns}

    def check_first_rows(self, num_lines: int = 100) -> None:
        """Parse the first lines of every file now, so that a wrong format, delimiter or column
        stops the run before training time is spent: the check fails when more rows than
        ``max_malformed_rows`` are bad, or when no row is good."""
        for file_index in range(len(self._files)):
            with self._files[file_index] as file:
                head = b"".join(file.readline() for _ in range(num_lines))
            if head and not head.endswith(b"\n"):
                head += b"\n"
            parsed = self.parse(head, file_index, 0)
            problems = sorted(parsed.problems.items())
            if problems and (len(problems) > self._max_malformed_rows or not parsed.valid.any()):
                line, problem = problems[self._max_malformed_rows if len(problems) > self._max_malformed_rows else 0]
                raise DataError(
                    f"Line {line + 1} of {self.file_name(file_index)} does not fit the schema: {problem} "
                    f"(found checking the first {num_lines} lines; `dataset.max_malformed_rows` is "
                    f"{self._max_malformed_rows})."
                )

    # The format -------------------------------------------------------------------------------

    def parse(self, buffer: bytes, file_index: int, first_line: int) -> ParsedLines:
        data = np.frombuffer(buffer, dtype=np.uint8)
        line_ends = np.flatnonzero(data == ord("\n")).astype(np.int64) + 1
        num_lines = len(line_ends)
        skip = 1 if self._schema.header and first_line == 0 else 0
        if skip:
            self._check_header(buffer[: line_ends[0]], file_index)
        problems: dict[int, str] = {}
        table = self._read_table(buffer[line_ends[0] if skip else 0 :], skip, problems)
        rows = np.setdiff1d(np.arange(skip, num_lines), np.fromiter(problems, dtype=np.int64, count=len(problems)))
        if len(rows) != table.num_rows:
            raise DataError(
                f"Lines {first_line + 1}-{first_line + num_lines} of {self.file_name(file_index)} must hold one row "
                f"each, but hold {table.num_rows} rows instead (a quoted field with a newline inside?)."
            )
        labels = self._labels(table.column(self._schema.label.column).combine_chunks(), rows, problems)
        dense = np.zeros((table.num_rows, len(self._schema.dense_columns)), dtype=np.float32)
        dense_specs = [(name, spec) for spec in self._schema.dense for name in spec.columns]
        for index, (name, spec) in enumerate(dense_specs):
            values, ok = _numbers(table.column(name).combine_chunks(), spec.fill)
            _note(problems, rows, ~ok, table.column(name), f"`{name}` must be a finite number or empty")
            dense[:, index] = np.log1p(np.maximum(values, 0.0)) if spec.log else values
        sparse = [self._ids(name, table.column(name).combine_chunks()) for name in self._schema.categorical_columns]

        valid = np.zeros(num_lines, dtype=np.bool_)
        valid[rows] = True
        valid[list(problems)] = False
        columns = (labels, dense, *sparse)
        return ParsedLines(line_ends, valid, tuple(_per_line(c, rows, num_lines) for c in columns), problems)

    def make_batch(self, columns: tuple[npt.NDArray[Any], ...]) -> CTRBatch:
        labels, dense, *sparse = columns
        features = {}
        for name, ids in zip(self._schema.categorical_columns, sparse):
            if ids.dtype == object:  # Multi-hot: a bag of ids per row.
                lengths = np.fromiter((len(bag) for bag in ids), dtype=np.int64, count=len(ids))
                flat = np.concatenate([*ids, np.zeros(0, np.int64)]).astype(np.int64)
            else:
                lengths, flat = np.ones(len(ids), dtype=np.int64), ids.astype(np.int64)
            features[name] = (flat, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
        return make_ctr_batch(dense, features, labels)

    def empty_columns(self) -> tuple[npt.NDArray[Any], ...]:
        sparse = [
            _bags([]) if self._groups[name].separator else np.zeros(0, np.int64)
            for name in self._schema.categorical_columns
        ]
        return (np.zeros(0, np.float32), np.zeros((0, len(self._schema.dense_columns)), np.float32), *sparse)

    # Columns ---------------------------------------------------------------------------------

    def _column_names(self) -> list[str]:
        if not self._schema.header:
            assert self._schema.column_names is not None
            return list(self._schema.column_names)
        with self._files[0] as file:
            first = file.readline()
        if not first:
            raise DataError(f"{self.file_name(0)} must start with a header line, but is empty.")
        return self._split_header(first, 0)

    def _split_header(self, line: bytes, file_index: int) -> list[str]:
        try:
            header = pa_csv.read_csv(
                io.BytesIO(line),
                read_options=pa_csv.ReadOptions(autogenerate_column_names=True),
                parse_options=self._parse_options(),
                convert_options=pa_csv.ConvertOptions(strings_can_be_null=False),
            )
        except pa.ArrowInvalid as ex:
            raise DataError(f"Line 1 of {self.file_name(file_index)} must be a header, but is not: {ex}") from None
        return [str(header.column(i)[0]).strip() for i in range(header.num_columns)]

    def _check_header(self, line: bytes, file_index: int) -> None:
        names = self._split_header(line, file_index)
        if names != self._names:
            raise DataError(
                f"Line 1 of {self.file_name(file_index)} must name the columns {self._names} as the first file "
                f"does, but names {names} instead."
            )

    def _parse_options(self, problems: dict[int, str] | None = None, first_line: int = 0) -> pa_csv.ParseOptions:
        expected = len(getattr(self, "_names", []))

        def invalid_row(row: Any) -> str:
            if problems is None or row.number is None:
                return "error"
            problems[first_line + row.number - 1] = (
                f"it must have {expected} fields, but has {row.actual_columns} instead"
            )
            return "skip"

        return pa_csv.ParseOptions(
            delimiter=self._schema.field_delimiter,
            quote_char=self._schema.quote_char or False,
            newlines_in_values=False,
            ignore_empty_lines=False,
            invalid_row_handler=invalid_row,
        )

    def _read_table(self, buffer: bytes, first_line: int, problems: dict[int, str]) -> pa.Table:
        used = [self._schema.label.column, *self._schema.dense_columns, *self._schema.categorical_columns]
        return pa_csv.read_csv(
            io.BytesIO(buffer),
            read_options=pa_csv.ReadOptions(column_names=self._names, use_threads=False, block_size=len(buffer) + 1),
            parse_options=self._parse_options(problems, first_line),
            convert_options=pa_csv.ConvertOptions(
                include_columns=used,
                column_types={name: pa.string() for name in used},
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
            ),
        )

    def _labels(
        self, values: pa.Array, rows: npt.NDArray[np.int64], problems: dict[int, str]
    ) -> npt.NDArray[np.float32]:
        spec = self._schema.label
        if spec.threshold is not None:
            numbers, ok = _numbers(values, fill=float("nan"))
            ok &= np.isfinite(numbers)
            labels = (numbers >= spec.threshold).astype(np.float32)
            _note(problems, rows, ~ok, values, f"the label `{spec.column}` must be a finite number")
            return labels
        text = pc.utf8_trim_whitespace(values)
        positive = pc.is_in(text, value_set=pa.array(spec.positive)).to_numpy(zero_copy_only=False)
        negative = pc.is_in(text, value_set=pa.array(spec.negative)).to_numpy(zero_copy_only=False)
        ok = positive | negative
        allowed = ", ".join(repr(v) for v in [*spec.positive, *spec.negative])
        _note(problems, rows, ~ok, values, f"the label `{spec.column}` must be one of {allowed}")
        clicks: npt.NDArray[np.float32] = positive.astype(np.float32)
        return clicks

    def _ids(self, name: str, values: pa.Array) -> npt.NDArray[Any]:
        group: CategoricalColumns = self._groups[name]
        if group.separator is None:
            return hash_ids(pc.utf8_trim_whitespace(values), name, group.num_buckets)
        bags = pc.split_pattern(values, group.separator)
        ids = hash_ids(pc.utf8_trim_whitespace(bags.flatten()), name, group.num_buckets)
        return _bags(np.split(ids, bags.offsets.to_numpy()[1:-1]) if len(values) else [])


def _numbers(values: pa.Array, fill: float) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
    """The numbers of a text column (empty: ``fill``), and which fields were numbers or empty."""
    text = pc.utf8_trim_whitespace(values)
    empty = pc.equal(text, "").to_numpy(zero_copy_only=False)
    number = pc.match_substring_regex(text, _NUMBER).to_numpy(zero_copy_only=False)
    ok = empty | number
    safe = pc.if_else(pa.array(number), text, pa.scalar("0"))
    numbers = pc.cast(safe, pa.float64()).to_numpy(zero_copy_only=False)
    numbers = np.where(empty, fill, numbers)
    ok &= np.isfinite(numbers) | empty
    return numbers, ok


def _note(
    problems: dict[int, str], rows: npt.NDArray[np.int64], bad: npt.NDArray[np.bool_], values: Any, what: str
) -> None:
    """Record the first problem of each bad row (a line keeps the problem found first)."""
    for index in np.flatnonzero(bad):
        line = int(rows[index])
        if line not in problems:
            problems[line] = f"{what}, but is {str(values[int(index)])!r} instead"


def _bags(parts: Sequence[npt.NDArray[np.int64]]) -> npt.NDArray[Any]:
    """An object array of id arrays, one per row (numpy would stack equal-length arrays otherwise)."""
    bags = np.empty(len(parts), dtype=object)
    for index, part in enumerate(parts):
        bags[index] = part
    return bags


def _per_line(values: npt.NDArray[Any], rows: npt.NDArray[np.int64], num_lines: int) -> npt.NDArray[Any]:
    """``values`` of the parsed rows spread over all lines (the others hold zeros, or empty bags)."""
    if values.dtype == object:
        result = _bags([np.zeros(0, np.int64)] * num_lines)
        for index, row in enumerate(rows):
            result[row] = values[index]
        return result
    result = np.zeros((num_lines, *values.shape[1:]), dtype=values.dtype)
    result[rows] = values
    return result
