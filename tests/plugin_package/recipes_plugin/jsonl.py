"""The ``jsonl`` data format of the ``tabular`` recipe: one JSON object per line, its keys the columns.

pyarrow reads such files in record batches of typed columns (``pyarrow.json``), so the format is an
``ArrowReader`` that says how to open a file and read its batches; the schema then applies as it does
to Parquet files (values hashed by their text, joins, derived columns, histories, a split by value).
It registers as this module is imported: through this package's entry point the first time a config
names ``jsonl``, or by an import of the user's own.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.json as pa_json

from recsys.tabular.formats import DATA_FORMATS, ArrowFormatConfig, ArrowReader, ColumnFormat


class JsonLinesReader(ArrowReader):
    """Reads files of JSON objects, one per line; a column's type is the one pyarrow infers from the first block of
    lines of a file (a key absent from a line is a null)."""

    file_kind = "JSON-lines"

    def file_schema(self, file: Any) -> pa.Schema:
        return pa_json.open_json(file).schema

    def record_batches(self, file: Any, file_index: int, first_row: int) -> tuple[int, Iterator[pa.RecordBatch]]:
        """The batches from the first line, whatever ``first_row``: a line is found only by reading those before it."""
        return 0, iter(pa_json.open_json(file))


@DATA_FORMATS.register("jsonl", ArrowFormatConfig)
class JsonLines(ColumnFormat):
    """JSON-lines files, read by ``JsonLinesReader``."""

    reader_class = JsonLinesReader
