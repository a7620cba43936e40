"""Click-prediction batches from Parquet files, as a ``dataset`` schema declares them.

The streaming, shuffling, sharding, malformed-row counting and exact resume are
``recsys.data.stream``'s; this module is the chunk source: pyarrow reads record batches of the
schema's columns only, through fsspec (any path: local, memory://, s3://...), and
``recsys.tabular.typed_columns`` turns them into rows. A position is a row of a file (a record is a
row: "Row 7 of day.parquet"), and a resume seeks to the row group that holds it, from the file's
footer, and skips the rows before it within that group: it never reads a file from its start again.

Memory stays bounded whatever the file size: besides the reader's window, one row group's column
chunks (pyarrow reads a group's at once, so groups are read one by one) and one record batch of at
most ``read_batch_rows`` rows.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from contextlib import closing
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from recipes import ConfigError, DataError
from recsys.click.batch import CTRBatch, make_ctr_batch
from recsys.data.parse_ahead import parsed_ahead
from recsys.data.stream import START, ParsedLines, Position, StreamingReader, require_at_least
from recsys.tabular.added_columns import AddedColumns
from recsys.tabular.history import History
from recsys.tabular.schema import TabularDataSection
from recsys.tabular.typed_columns import TypedRows
from recsys.tabular.vocabulary import Encodings, ValueCounts


class ParquetReader(StreamingReader[CTRBatch]):
    """Reads the Parquet files of ``paths`` as ``schema`` says (its columns are found by name, so the
    text formats' ``header``, ``column_names``, ``delimiter`` and ``quote_char`` do not apply).

    Batches are ``TabularReader``'s: the dense columns in schema order as ``dense``, one sparse feature
    per categorical column (named after it), and the label as 0/1. Every file's columns are checked
    against the schema here, before any row is read. ``split`` and ``encodings`` are ``TabularReader``'s;
    ``read_batch_rows`` rows are read and converted at once; the other arguments are ``StreamingReader``'s.
    """

    record_name = "row"

    def __init__(
        self,
        paths: str | Sequence[str],
        schema: TabularDataSection,
        *,
        split: str = "train",
        encodings: Encodings | None = None,
        read_batch_rows: int = 65_536,
        **kwargs: Any,
    ) -> None:
        require_at_least("read_batch_rows", read_batch_rows, 1)
        vocabularies = [name for group in schema.categorical if group.vocabulary for name in group.columns]
        if vocabularies:
            raise ConfigError(
                f"`vocabulary` must be false with `format: parquet` (its values are hashed), but is true for "
                f"{vocabularies} instead."
            )
        self._schema = schema
        self._read_batch_rows = read_batch_rows
        super().__init__(paths, **kwargs)
        with self._files[0] as file:
            names = self._open(file, 0, []).schema_arrow.names
        encodings = encodings or Encodings({}, {})
        try:
            self._added = AddedColumns(
                schema, names, split, encodings.counts, histories=encodings.histories, file_name=self.file_name(0)
            )
        except ConfigError as error:
            raise DataError(str(error)) from None
        self._rows = TypedRows(schema, self._added)
        self._dictionary_columns: list[list[str]] = []
        for file_index in range(len(self._files)):
            with self._files[file_index] as file:
                types = self._check_columns(self._open(file, file_index, []), file_index)
            self._dictionary_columns.append(self._rows.dictionary_columns(types))

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
            row = start.offset if file_index == start.file_index else 0
            with self._files[file_index] as file:
                parquet = self._open(file, file_index, self._dictionary_columns[file_index])
                for batch in self._batches(parquet, file_index, row, self._read_batch_rows):
                    yield Position(file_index, row, row), batch
                    row += batch.num_rows

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

    def _open(self, file: Any, file_index: int, dictionary_columns: list[str]) -> pq.ParquetFile:
        try:
            return pq.ParquetFile(file, read_dictionary=dictionary_columns or None)
        except (pa.ArrowException, OSError) as ex:
            raise DataError(f"{self.file_name(file_index)} must be a Parquet file, but is not: {ex}") from None

    def _check_columns(self, parquet: pq.ParquetFile, file_index: int) -> dict[str, pa.DataType]:
        """The types of the schema's columns in the file, each checked to exist and to fit its role."""
        arrow_schema = parquet.schema_arrow
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

    def _batches(
        self, parquet: pq.ParquetFile, file_index: int, first_row: int, batch_rows: int
    ) -> Generator[pa.RecordBatch, None, None]:
        """Record batches of the schema's columns from row ``first_row`` on: from the row group that holds
        it (found in the footer), whose rows before it are skipped.

        One row group at a time: pyarrow reads all the column chunks of the groups it is given in one go
        (``pre_buffer``), which for a whole file would be memory growing with the file.
        """
        metadata = parquet.metadata
        group_starts = np.cumsum([0] + [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)])
        first_group = int(np.searchsorted(group_starts, first_row, side="right")) - 1
        skip = first_row - int(group_starts[first_group])
        try:
            for group in range(first_group, metadata.num_row_groups):
                for batch in parquet.iter_batches(
                    batch_size=batch_rows, row_groups=[group], columns=self._rows.columns
                ):
                    if skip >= batch.num_rows:
                        skip -= batch.num_rows
                        continue
                    yield batch.slice(skip) if skip else batch
                    skip = 0
        except (pa.ArrowException, OSError) as ex:
            raise DataError(f"{self.file_name(file_index)} must be a readable Parquet file, but is not: {ex}") from None

    def count_values(self) -> dict[str, ValueCounts]:
        """The counts of the sources of the ``count`` and ``count_before`` columns in the kept, well-formed rows of
        every file: one pass over the data, for ``recsys.tabular.vocabulary``."""
        counters = self._added.counters()
        for _, parsed, batch in self._parsed_batches():
            keys, numbers = self._rows.file_keys_and_numbers(batch)
            for name, (source, orders) in self._added.count_sources(keys, numbers).items():
                counters[name].add(source[parsed.valid], None if orders is None else orders[parsed.valid])
        return {name: counter.totals() for name, counter in counters.items()}

    def histories(self) -> dict[str, History]:
        """The rows of each ``history`` column in the well-formed rows of every file (a reader of the split
        ``all``): one pass over the data, for ``recsys.tabular.history``."""
        chunks = (
            (*self._rows.file_keys_and_numbers(batch), parsed.valid) for _, parsed, batch in self._parsed_batches()
        )
        return self._added.gather_histories(chunks)

    def _parse(self, batch: pa.RecordBatch) -> ParsedLines:
        columns, problems, keep = self._rows.convert(batch)
        valid = np.ones(batch.num_rows, dtype=np.bool_) if keep is None else keep.copy()
        valid[list(problems)] = False
        return ParsedLines(np.arange(1, batch.num_rows + 1, dtype=np.int64), valid, columns, problems)
