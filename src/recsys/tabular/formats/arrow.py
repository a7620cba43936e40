"""Click-prediction batches from files that pyarrow reads as record batches (Parquet, JSON lines...).

A columnar file carries its columns' names and types, so a format of such files only says how to
open one and read its record batches from a row: a subclass of ``ArrowReader`` (Parquet's, in
``recsys.tabular.formats.parquet``, seeks to the row group that holds the row). The rest is this module's:
every file's columns are checked against the schema before any row is read,
``recsys.tabular.typed_columns`` turns the record batches into rows, and the streaming, shuffling,
sharding, malformed-row counting and exact resume are ``recsys.data.stream``'s. A position is a row of
a file (a record is a row: "Row 7 of day.parquet"), and a resume starts reading again from the row
it names.

The values of such formats are hashed: no ``vocabulary`` is counted (``ArrowFormatConfig`` refuses it).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Generator, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from recipes import ConfigError, DataError
from recsys.click.batch import CTRBatch, make_ctr_batch
from recsys.data.parse_ahead import parsed_ahead
from recsys.data.stream import START, ParsedLines, Position
from recsys.tabular.added_columns import AddedColumns, RowOrders
from recsys.tabular.formats.data_format import ColumnReader
from recsys.tabular.formats.format_config import DataFormatConfig
from recsys.tabular.schema import TabularDataSection
from recsys.tabular.split_files import paths_key
from recsys.tabular.typed_columns import TypedRows
from recsys.tabular.vocabulary import Encodings, ValueCounts


@dataclass
class ArrowFormatConfig(DataFormatConfig):
    """The options of a format read by an ``ArrowReader``: none but its name."""

    name: str = "parquet"

    def check(self, schema: TabularDataSection) -> None:
        vocabularies = [name for group in schema.categorical if group.vocabulary for name in group.columns]
        if vocabularies:
            raise ValueError(
                f"`vocabulary` must be false with `format: {self.name}` (its values are hashed), but is true for "
                f"{vocabularies} instead."
            )


class ArrowReader(ColumnReader):
    """Reads the files of ``paths`` as ``schema`` says (its columns are found by name, so no header or column
    names are needed). A subclass says how to open a file (``file_schema``) and read its record batches from a
    row (``record_batches``).

    Batches are ``TabularReader``'s: the dense columns in schema order as ``dense``, one sparse feature per
    categorical column (named after it), and the label as 0/1. ``split`` and ``encodings`` are
    ``TabularReader``'s; the other arguments are ``StreamingReader``'s.
    """

    record_name = "row"
    file_kind: ClassVar[str]
    """What the files are, in messages: ``Parquet`` (``day.parquet must be a Parquet file``)."""

    def __init__(
        self,
        paths: str | Sequence[str],
        schema: TabularDataSection,
        *,
        split: str = "train",
        encodings: Encodings | None = None,
        **kwargs: Any,
    ) -> None:
        self._schema = schema
        super().__init__(paths, paths_key=paths_key(split), **kwargs)
        names = self._file_schema(0).names
        encodings = encodings or Encodings({}, {})
        try:
            self._added = AddedColumns(
                schema,
                names,
                split,
                encodings.counts,
                histories=encodings.histories,
                ranks=encodings.ranks,
                file_name=self.file_name(0),
            )
        except ConfigError as error:
            raise DataError(str(error)) from None
        self._rows = TypedRows(schema, self._added)
        self._types = [self._check_columns(self._file_schema(index), index) for index in range(len(self._files))]

    # What a format says ------------------------------------------------------------------------

    @abstractmethod
    def file_schema(self, file: Any) -> pa.Schema:
        """The names and types of the columns of an open file."""

    @abstractmethod
    def record_batches(self, file: Any, file_index: int, first_row: int) -> tuple[int, Iterator[pa.RecordBatch]]:
        """The record batches of the open file ``file_index`` from a row at or before ``first_row`` (a format
        that can seek starts near it; one that cannot, at row 0), and that row. They hold at least the
        ``columns``; a format that can read a column dictionary-encoded reads the ``dictionary_columns`` so."""

    @property
    def columns(self) -> list[str]:
        """The file columns the schema reads, label first."""
        return self._rows.columns

    def dictionary_columns(self, file_index: int) -> list[str]:
        """The single-valued categorical string columns of file ``file_index``, which convert fastest
        dictionary-encoded: their dictionary is hashed once instead of every row."""
        return self._rows.dictionary_columns(self._types[file_index])

    # The chunk source --------------------------------------------------------------------------

    def read_chunks(self, start: Position) -> Generator[tuple[Position, ParsedLines], None, None]:
        """Record batches from row ``start.offset`` of file ``start.file_index`` on; a position's offset and
        record number are both the row."""
        for position, parsed, _ in self._parsed_batches(start):
            yield position, parsed

    def _parsed_batches(
        self, start: Position = START
    ) -> Generator[tuple[Position, ParsedLines, pa.RecordBatch], None, None]:
        def parse(item: tuple[Position, pa.RecordBatch]) -> tuple[Position, ParsedLines, pa.RecordBatch]:
            position, batch = item
            return position, self._parse(batch), batch

        with (
            closing(self._record_batches(start)) as batches,
            closing(parsed_ahead(parse, batches, self.parse_threads)) as parsed,
        ):
            yield from parsed

    def _record_batches(self, start: Position) -> Generator[tuple[Position, pa.RecordBatch], None, None]:
        for file_index in range(start.file_index, len(self._files)):
            first_row = start.offset if file_index == start.file_index else 0
            with self._files[file_index] as file:
                for row, batch in self._batches_from(file, file_index, first_row):
                    yield Position(file_index, row, row), batch

    def _batches_from(
        self, file: Any, file_index: int, first_row: int
    ) -> Generator[tuple[int, pa.RecordBatch], None, None]:
        """The file's record batches from row ``first_row`` on, each with its first row (the rows before
        ``first_row`` that the format's batches start with are skipped)."""
        try:
            row, batches = self.record_batches(file, file_index, first_row)
            for batch in batches:
                skip = max(first_row - row, 0)
                if skip < batch.num_rows:
                    yield row + skip, batch.slice(skip) if skip else batch
                row += batch.num_rows
        except (pa.ArrowException, OSError) as ex:
            raise DataError(
                f"{self.file_name(file_index)} must be a readable {self.file_kind} file, but is not: {ex}"
            ) from None

    def make_batch(self, columns: tuple[npt.NDArray[Any], ...]) -> CTRBatch:
        labels, dense, *categorical = columns
        one_each = np.arange(len(labels) + 1, dtype=np.int64)
        features = {}
        for name, ids in zip(self._schema.categorical_columns, categorical):
            if ids.dtype != object:
                features[name] = (ids, one_each)
                continue
            lengths = np.fromiter((len(bag) for bag in ids), dtype=np.int64, count=len(ids))  # Multi-hot bags.
            offsets = np.concatenate([np.zeros(1, np.int64), np.cumsum(lengths)])
            features[name] = (np.concatenate([*ids, np.zeros(0, np.int64)]), offsets)
        return make_ctr_batch(dense, features, labels)

    def empty_columns(self) -> tuple[npt.NDArray[Any], ...]:
        return self._rows.empty_rows()

    # Files -------------------------------------------------------------------------------------

    def _file_schema(self, file_index: int) -> pa.Schema:
        with self._files[file_index] as file:
            try:
                return self.file_schema(file)
            except (pa.ArrowException, OSError) as ex:
                raise DataError(
                    f"{self.file_name(file_index)} must be a {self.file_kind} file, but is not: {ex}"
                ) from None

    def _check_columns(self, arrow_schema: pa.Schema, file_index: int) -> dict[str, pa.DataType]:
        """The types of the schema's columns in the file, each checked to exist and to fit its role."""
        for name in self._rows.columns:
            if name not in arrow_schema.names:
                raise DataError(
                    f"The schema's column '{name}' must be a column of {self.file_name(file_index)}, but the "
                    f"file's columns are {arrow_schema.names} instead."
                )
            problem = self._rows.type_problem(name, arrow_schema.field(name).type)
            if problem is not None:
                raise DataError(f"The column '{name}' of {self.file_name(file_index)} {problem}.")
        return {name: arrow_schema.field(name).type for name in self._rows.columns}

    # One pass over the rows --------------------------------------------------------------------

    def count_values(self) -> dict[str, ValueCounts]:
        counters = self._added.counters()
        for _, parsed, batch in self._parsed_batches():
            keys, numbers = self._rows.file_keys_and_numbers(batch)
            for name, (source, orders) in self._added.count_sources(keys, numbers).items():
                counters[name].add(source[parsed.valid], None if orders is None else orders[parsed.valid])
        return {name: counter.totals() for name, counter in counters.items()}

    def row_orders(self) -> RowOrders:
        chunks = (
            (*self._rows.file_keys_and_numbers(batch), parsed.valid) for _, parsed, batch in self._parsed_batches()
        )
        return self._added.gather_orders(chunks)

    def column_texts(self, columns: Sequence[str]) -> Iterator[dict[str, pa.Array]]:
        for _, batch in self._record_batches(START):
            yield {name: batch.column(name) for name in columns}

    def _parse(self, batch: pa.RecordBatch) -> ParsedLines:
        columns, problems, keep = self._rows.convert(batch)
        valid = np.ones(batch.num_rows, dtype=np.bool_) if keep is None else keep.copy()
        valid[list(problems)] = False
        return ParsedLines(np.arange(1, batch.num_rows + 1, dtype=np.int64), valid, columns, problems)
