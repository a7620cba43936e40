"""What a data format is to the ``tabular`` recipe, which reads every format without naming one.

A format is a component of ``DATA_FORMATS`` (``format_config.py``): a name, a config dataclass
(its options, and what it refuses in a schema) and a ``DataFormat`` class, built over a schema, that
the recipe asks for a reader of a split's files, for the sparse features its batches hold and for
the tables that look them up. The built-in formats register where they are defined, a module of this
folder each (``delimited_text.py``: CSV/TSV, ``libsvm.py``, ``parquet.py``); another package registers
its own the same way, by decorator in a module that an entry point of the group
``recipes.data_formats`` names::

    @DATA_FORMATS.register("jsonl", ArrowFormatConfig)
    class JsonLines(ColumnFormat):
        reader_class = JsonLinesReader

A format either reads the schema's columns (a ``ColumnFormat``: the label, dense and categorical
groups, joins, derived columns and histories apply) or brings features of its own (libSVM's tokens),
and then the schema's columns must be empty (its config's ``check``). ``arrow.py`` reads
the columns of any file that pyarrow reads in record batches, for a format to name as its reader.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from components import RegistryError
from embedding import Pooling
from recsys.click.batch import CTRBatch
from recsys.data.stream import StreamingReader
from recsys.models.embeddings import TableSpec
from recsys.tabular.added_columns import RowOrders
from recsys.tabular.formats.format_config import DATA_FORMATS
from recsys.tabular.history import History
from recsys.tabular.schema import CategoricalColumns, TabularDataSection
from recsys.tabular.vocabulary import Encodings, ValueCounts

if TYPE_CHECKING:
    import pyarrow as pa


class DataFormat(ABC):
    """A format over the schema whose files it reads (its options are the schema's ``format``)."""

    def __init__(self, schema: TabularDataSection) -> None:
        self.schema = schema

    @abstractmethod
    def reader(
        self, paths: str | Sequence[str], *, split: str, encodings: Encodings | None, **options: Any
    ) -> StreamingReader[CTRBatch]:
        """A reader of the files ``paths`` that keeps the rows of ``split`` (``train``, ``valid``, ``test``, or
        ``all`` for a pass over every row), with the ``encodings`` the schema's columns need; ``options`` are
        ``StreamingReader``'s."""

    @abstractmethod
    def sparse_features(self) -> list[str]:
        """The names of the batches' sparse features, in order."""

    @abstractmethod
    def tables(self) -> list[TableSpec]:
        """The tables that look the sparse features up."""

    def sequence_lengths(self) -> dict[str, int]:
        """The sparse features that are sequences, with the most ids a row of each keeps (none by default)."""
        return {}


class ColumnReader(StreamingReader[CTRBatch]):
    """A reader of the schema's columns. Besides batches, it makes one pass over every row of its files for
    what those columns need before the first batch."""

    @abstractmethod
    def count_values(self) -> dict[str, ValueCounts]:
        """The counts of the values of the vocabulary columns and of the sources of ``count`` and ``count_before``
        columns in the kept, well-formed rows of every file, for ``recsys.tabular.vocabulary``."""

    @abstractmethod
    def row_orders(self) -> RowOrders:
        """The rows of each ``history`` column, and with ``split.last_of`` the events of every key, in the
        well-formed rows of every file (a reader of the split ``all``), in one pass: for ``recsys.tabular.history``
        and ``recsys.tabular.leave_one_out``."""

    def histories(self) -> dict[str, History]:
        """The rows of each ``history`` column, as ``row_orders`` gathers them."""
        return self.row_orders().histories

    def column_texts(self, columns: Sequence[str]) -> Iterator[dict[str, pa.Array]]:
        """The values of the file columns ``columns`` in every row of every file, a chunk of rows at a time, as the
        file holds them (text, numbers, or lists of either), for ``recsys.tabular.value_texts`` to name the ids
        by. A row that does not parse may be left out. A format that cannot read them raises
        ``NotImplementedError`` (the default, so that a format written before this method still reads): ``export``
        then writes no texts beside its ids."""
        raise NotImplementedError(f"{type(self).__name__} does not read its columns' texts.")


class ColumnFormat(DataFormat):
    """A format whose files hold the schema's columns: one sparse feature per categorical column, read by
    ``reader_class``."""

    reader_class: ClassVar[Callable[..., ColumnReader]]
    """``reader_class(paths, schema, split=..., encodings=..., **options)``: the reader of the format's files."""

    def reader(
        self, paths: str | Sequence[str], *, split: str, encodings: Encodings | None, **options: Any
    ) -> ColumnReader:
        return self.reader_class(paths, self.schema, split=split, encodings=encodings, **options)

    def sparse_features(self) -> list[str]:
        return self.schema.categorical_columns

    def sequence_lengths(self) -> dict[str, int]:
        return {
            name: group.max_len
            for group in self.schema.categorical
            if group.max_len is not None
            for name in group.columns
        }

    def tables(self) -> list[TableSpec]:
        """One table per categorical column, or one per group with a ``shared_table``, which the groups of
        ``same_ids_as`` look up too; multi-hot bags pool by mean, sequences not at all."""
        features: dict[str, list[str]] = {}
        groups_of: dict[str, list[CategoricalColumns]] = {}
        rows: dict[str, int] = {}
        for group in self.schema.categorical:
            for name in group.columns:
                table = self.table_of(name)
                features.setdefault(table, []).append(name)
                groups_of.setdefault(table, []).append(group)
                rows[table] = group.num_buckets
        return [
            TableSpec(table, rows[table], tuple(names), _pooling(groups_of[table])) for table, names in features.items()
        ]

    def table_of(self, column: str) -> str:
        """The table that looks up the categorical ``column``: its kind's (``same_ids_as``) shared table, or the
        kind's own."""
        kind = self.schema.id_kind(column)
        shared = self.schema.groups_by_column[kind].shared_table
        return kind if shared is None else shared


def _pooling(groups: Sequence[CategoricalColumns]) -> Pooling:
    """How a table's features pool: not at all for sequences, by mean for bags, else (one id a row) by sum."""
    if any(group.sequence for group in groups):
        return "none"
    return "mean" if any(group.multi_hot for group in groups) else "sum"


def data_format(schema: TabularDataSection) -> DataFormat:
    """The format that ``schema.format`` names, over ``schema``."""
    name = schema.format.name
    format_class = DATA_FORMATS.get(name).value
    if not (isinstance(format_class, type) and issubclass(format_class, DataFormat)):
        raise RegistryError(
            f"The data format '{name}' must be registered as a DataFormat subclass, but is {format_class!r} instead."
        )
    return format_class(schema)
