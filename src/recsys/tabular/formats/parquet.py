"""The ``parquet`` data format: click-prediction batches from Parquet files, as a ``dataset`` schema declares them.

pyarrow reads record batches of the schema's columns only, through fsspec (any path: local,
memory://, s3://...); ``recsys.tabular.formats.arrow`` does the rest. A resume seeks to the row group that
holds its row, from the file's footer, and skips the rows before it within that group: it never
reads a file from its start again.

Memory stays bounded whatever the file size: besides the reader's window, one row group's column
chunks (pyarrow reads a group's at once, so groups are read one by one) and one record batch of at
most ``read_batch_rows`` rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recsys.data.stream import require_at_least
from recsys.tabular.formats.arrow import ArrowFormatConfig, ArrowReader
from recsys.tabular.formats.data_format import ColumnFormat
from recsys.tabular.formats.format_config import DATA_FORMATS
from recsys.tabular.schema import TabularDataSection
from recsys.tabular.split_files import refuse_rowless_split


class ParquetReader(ArrowReader):
    """Reads the Parquet files of ``paths`` as ``schema`` says, ``read_batch_rows`` rows read and converted at
    once; the other arguments are ``ArrowReader``'s."""

    file_kind = "Parquet"

    def __init__(
        self,
        paths: str | Sequence[str],
        schema: TabularDataSection,
        *,
        split: str = "train",
        read_batch_rows: int = 65_536,
        **kwargs: Any,
    ) -> None:
        require_at_least("read_batch_rows", read_batch_rows, 1)
        self._read_batch_rows = read_batch_rows
        self._split = split
        super().__init__(paths, schema, split=split, **kwargs)

    def check_first_rows(self, num_records: int = 100) -> None:
        """As any streaming reader's, and a validation or test split of no row is refused (``split_files``)."""
        super().check_first_rows(num_records)
        refuse_rowless_split(self, self._split, len(self._files), header_lines=0)

    def file_schema(self, file: Any) -> pa.Schema:
        return pq.ParquetFile(file).schema_arrow

    def record_batches(self, file: Any, file_index: int, first_row: int) -> tuple[int, Iterator[pa.RecordBatch]]:
        """The batches from the row group that holds ``first_row`` (found in the footer), one row group at a time:
        pyarrow reads all the column chunks of the groups it is given in one go (``pre_buffer``), which for a
        whole file would be memory growing with the file."""
        parquet = pq.ParquetFile(file, read_dictionary=self.dictionary_columns(file_index) or None)
        metadata = parquet.metadata
        group_starts = np.cumsum([0] + [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)])
        first_group = int(np.searchsorted(group_starts, first_row, side="right")) - 1
        batches = (
            batch
            for group in range(first_group, metadata.num_row_groups)
            for batch in parquet.iter_batches(
                batch_size=self._read_batch_rows, row_groups=[group], columns=self.columns
            )
        )
        return int(group_starts[first_group]), batches


@DATA_FORMATS.register("parquet", ArrowFormatConfig)
class Parquet(ColumnFormat):
    """Parquet files, read by ``ParquetReader``."""

    reader_class = ParquetReader
