"""The layout of the raw Criteo click logs (Kaggle / Terabyte format), as a ``dataset`` schema.

Each line holds a label (0 or 1), 13 integer features ``I1``-``I13`` and 26 categorical features
``C1``-``C26`` (hexadecimal hashes), separated by tabs, without a header; any feature may be empty.
``criteo_schema`` declares that to ``recsys.tabular.formats.delimited_text.TabularReader``, which streams,
shuffles, shards and resumes; what the schema makes of the fields is DLRM's:

- Integer features become ``log(max(x, 0) + 1)``; an empty one becomes 0 (any finite number is read;
  other text makes the line malformed).
- A categorical value gets the id ``recsys.tabular.hashing`` gives its text in a table of
  ``num_embeddings`` rows (``1 + key % (num_embeddings - 1)``); an empty one the id 0, which no
  value shares. The ids are those of the ``tabular`` recipe's ``criteo_kaggle`` preset.
"""

from __future__ import annotations

from collections.abc import Sequence

from recsys.tabular.formats.delimited_text import TsvConfig
from recsys.tabular.labels import LabelColumn
from recsys.tabular.schema import CategoricalColumns, DenseColumns, TabularDataSection

NUM_DENSE_FEATURES = 13
NUM_SPARSE_FEATURES = 26
DENSE_FEATURE_NAMES = tuple(f"I{i}" for i in range(1, NUM_DENSE_FEATURES + 1))
SPARSE_FEATURE_NAMES = tuple(f"C{i}" for i in range(1, NUM_SPARSE_FEATURES + 1))
COLUMN_NAMES = ("label", *DENSE_FEATURE_NAMES, *SPARSE_FEATURE_NAMES)


def table_sizes(num_embeddings_per_feature: int | Sequence[int]) -> list[int]:
    """The rows of the 26 features' tables: one size for all, or one per feature (each at least 2:
    id 0 is an empty field's, and every value needs a row besides it)."""
    if isinstance(num_embeddings_per_feature, int):
        sizes = [num_embeddings_per_feature]
    else:
        sizes = list(num_embeddings_per_feature)
    if len(sizes) == 1:
        sizes *= NUM_SPARSE_FEATURES
    if len(sizes) != NUM_SPARSE_FEATURES or min(sizes) < 2:
        raise ValueError(
            f"`num_embeddings_per_feature` must be one int >= 2 or {NUM_SPARSE_FEATURES} of them, "
            f"but is {num_embeddings_per_feature} instead."
        )
    return sizes


def criteo_schema(num_embeddings_per_feature: int | Sequence[int]) -> TabularDataSection:
    """The schema of Criteo-format files whose categorical features have tables of these sizes
    (see ``table_sizes``)."""
    sizes = table_sizes(num_embeddings_per_feature)
    if len(set(sizes)) == 1:
        categorical = [CategoricalColumns(columns=list(SPARSE_FEATURE_NAMES), num_buckets=sizes[0])]
    else:
        categorical = [
            CategoricalColumns(columns=[name], num_buckets=n) for name, n in zip(SPARSE_FEATURE_NAMES, sizes)
        ]
    return TabularDataSection(
        format=TsvConfig(header=False, quote_char=None, column_names=list(COLUMN_NAMES)),
        label=LabelColumn(column="label"),
        dense=[DenseColumns(columns=list(DENSE_FEATURE_NAMES), log=True)],
        categorical=categorical,
    )
