"""The kind "data format": ``DATA_FORMATS``, and the config every format's derives from (the ``format`` section).

Apart from the schema (``recsys.tabular.schema``), whose ``format`` field chooses from it, and from what a
format is to the ``tabular`` recipe (``data_format.py``), so that the schema can name the registry before
any format, each of which reads a schema, is defined.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import pyarrow as pa

from components import Registry


@dataclass
class DataFormatConfig:
    """The ``format`` section: which format the files are in, by ``name``; each format's own dataclass, derived
    from this one, adds its options (CSV's ``delimiter``, libSVM's ``num_fields``) and says in ``check`` what it
    cannot read."""

    name: str = "csv"
    """The format, by its registered name (``csv``, ``tsv``, ``parquet``, ``libsvm``, ``libffm``...)."""

    reads_side_tables: ClassVar[bool] = False
    """Whether a join's ``format`` may be this one (``read_side_table``)."""

    def read_side_table(self, raw: bytes) -> pa.Table:
        """A joined table's whole file, every column as text (a format whose ``reads_side_tables``)."""
        raise NotImplementedError(f"The format '{self.name}' reads no joined table.")

    def check(self, schema: Any) -> None:
        """Raise a ``ValueError`` (one line) for what the format cannot read in ``schema``, the
        ``recsys.tabular.schema.TabularDataSection`` that holds this config (typed ``Any`` here, as the schema
        imports this module): called as the schema is built, so that the config is refused before any file is
        opened."""

    def with_full_keys(self) -> DataFormatConfig:
        """These options for a reader feeding hash tables (``with_full_keys``): the same, unless the format hashes
        values into buckets of its own."""
        return self


DATA_FORMATS: Registry[type] = Registry("data format", "recipes.data_formats", DataFormatConfig)
"""The data formats by name, each with its config dataclass; the value is the format's class, a
``recsys.tabular.formats.data_format.DataFormat`` (not named here, as it is built over a schema)."""
