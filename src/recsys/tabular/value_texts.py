"""The text behind the ids of the schema's categorical columns: what a serving system, given a row's text, needs
to find the rows of an exported table without this project's hashing.

A value's id is a hash of its text (a row of a fixed table, or the full 64-bit key of a hash table) or its rank in
a vocabulary, none of which can be read back. One pass over the training files collects each column's distinct
values (a multi-hot field split by its ``separator``), trimmed of ASCII whitespace as the readers trim them, and
gives each the id the readers give it; a joined column's values come from its side table. Values that share a
hashed row are all listed under it; values out of a vocabulary (id 1) and empty ones (id 0) are not listed.
Derived columns (a timestamp's hour, a count) hold numbers, not text, and are left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pyarrow as pa
import pyarrow.compute as pc

from recsys.tabular.formats.data_format import ColumnReader
from recsys.tabular.hashing import text_keys
from recsys.tabular.joins import read_side_table
from recsys.tabular.schema import CategoricalColumns, TabularDataSection
from recsys.tabular.vocabulary import OUT_OF_VOCABULARY_ID, Encodings, column_ids


def feature_value_texts(
    schema: TabularDataSection, reader: ColumnReader, encodings: Encodings | None
) -> dict[str, pa.Table]:
    """Per categorical feature of ``schema`` read from files or side tables, its ids and their texts: a table of
    ``id`` (int64) and ``value`` (string), sorted by id, then value. ``reader`` reads the training files with the
    schema the training reader has (with full keys for hash tables), ``encodings`` its vocabularies."""
    groups = {name: group for group in schema.categorical for name in group.columns}
    derived = {column.name for column in schema.derived}
    joined = {name: join for join in schema.joins for name in join.columns if name in groups}
    file_columns = [name for name in schema.categorical_columns if name not in derived and name not in joined]
    distinct = _distinct_texts(reader.column_texts(file_columns), file_columns, groups)
    for join in {id(join): join for join in joined.values()}.values():
        side = read_side_table(join, schema.split)
        columns = [name for name in join.columns if name in groups]
        distinct.update(_distinct_texts([{name: side.column(name) for name in columns}], columns, groups))
    vocabularies = {} if encodings is None else encodings.vocabularies
    result = {}
    for name, values in distinct.items():
        keys = text_keys(values, schema.id_kind(name))
        ids = column_ids(keys, name, groups[name].num_buckets, encodings)
        kept = ids > OUT_OF_VOCABULARY_ID if name in vocabularies else keys != 0
        table = pa.table({"id": pa.array(ids[kept], pa.int64()), "value": values.filter(pa.array(kept))})
        result[name] = table.sort_by([("id", "ascending"), ("value", "ascending")])
    return result


def _distinct_texts(
    chunks: Iterable[Mapping[str, pa.Array | pa.ChunkedArray]],
    columns: list[str],
    groups: Mapping[str, CategoricalColumns],
) -> dict[str, pa.Array]:
    """Each column's distinct trimmed texts over the chunks (memory follows the distinct values, not the rows)."""
    seen: dict[str, list[pa.Array]] = {name: [] for name in columns}
    for chunk in chunks:
        for name in columns:
            seen[name].append(pc.unique(_texts(chunk[name], groups[name].separator)))
            if len(seen[name]) > 64:
                seen[name] = [pc.unique(pa.concat_arrays(seen[name]))]
    return {
        name: pc.unique(pa.concat_arrays(arrays)) if arrays else pa.array([], pa.large_string())
        for name, arrays in seen.items()
    }


def _texts(values: pa.Array | pa.ChunkedArray, separator: str | None) -> pa.Array:
    """The values as trimmed, non-empty large strings: a list's items, or a field's pieces between separators."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks else pa.array([], pa.large_string())
    if pa.types.is_list(values.type) or pa.types.is_large_list(values.type):
        values = pc.list_flatten(values)
    values = values.cast(pa.large_string())
    if separator:
        values = pc.list_flatten(pc.split_pattern(values, separator))
    values = pc.ascii_trim_whitespace(values.drop_null())
    return values.filter(pc.not_equal(values, ""))
