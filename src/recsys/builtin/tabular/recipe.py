"""The ``tabular`` recipe: a ``dataset`` schema in YAML, a zoo model by ``model.name``, no Python of the user's."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Literal

from recipes import (
    ConfigError,
    RecipeConfig,
    RecipeContext,
    RecipeParts,
    reader_options,
    register_recipe,
    tensor_parallel_mlp,
)
from recsys.click.batch import CTRBatch
from recsys.click.units import click_prediction_parts
from recsys.click.zoo import ZooModelSection, build_zoo_model
from recsys.data.stream import StreamingReader
from recsys.models.embeddings import TableSpec
from recsys.tabular.libsvm import LibSVMReader
from recsys.tabular.parquet import ParquetReader
from recsys.tabular.reader import TabularReader
from recsys.tabular.schema import HISTORY, LIBSVM_FORMATS, TabularDataSection, resolve_path, with_full_keys
from recsys.tabular.vocabulary import load_or_build_encodings

ENCODINGS_FILE = "vocabularies.npz"
"""The vocabularies and value counts counted at the first start (named before counts joined them)."""


@dataclass
class TabularConfig(RecipeConfig):
    model: ZooModelSection = field(default_factory=ZooModelSection)
    dataset: TabularDataSection = field(default_factory=TabularDataSection)


@register_recipe("tabular", TabularConfig, "Click prediction on CSV/TSV files declared by a schema, with a zoo model.")
def build_tabular(context: RecipeContext[TabularConfig]) -> RecipeParts:
    config, gangs = context.config, context.gangs
    data = config.dataset
    if data.train_path is None or data.valid_path is None:
        raise ConfigError("`dataset.train_path` and `dataset.valid_path` must name files, but are not set.")

    # Hash tables take each value's full 64-bit key; `num_buckets` then sizes them (see `_tables`).
    read_as = with_full_keys(data) if config.model.embeddings.kind == "hash" else data
    options: dict[str, Any] = {
        "shuffle_buffer_size": data.shuffle_buffer_size,
        "max_malformed_rows": data.max_malformed_rows,
        "parse_threads": data.parse_threads,
    }
    train_path, valid_path = resolve_path(data.train_path), resolve_path(data.valid_path)
    if data.format in LIBSVM_FORMATS:
        make_reader: Callable[..., StreamingReader[CTRBatch]] = partial(LibSVMReader, schema=read_as, **options)
    else:
        reader_class = ParquetReader if data.format == "parquet" else TabularReader
        encodings = load_or_build_encodings(
            os.path.join(context.output_dir, ENCODINGS_FILE),
            read_as,
            lambda: reader_class(train_path, read_as, split="train", batch_size=1, **options).count_values(),
        )
        if any(derived.transform == HISTORY for derived in data.derived):
            # Every configured file, each once, every row: a validation row's history holds its earlier
            # validation rows too, as a deployed model's would.
            paths = [resolve_path(path) for path in (data.train_path, data.valid_path, data.test_path) if path]
            every_row = reader_class(list(dict.fromkeys(paths)), read_as, split="all", batch_size=1, **options)
            encodings = replace(encodings, histories=every_row.histories())
        make_reader = partial(reader_class, schema=read_as, encodings=encodings, **options)

    def reader(path: str, split: str) -> StreamingReader[CTRBatch]:
        by_split = {} if data.format in LIBSVM_FORMATS else {"split": split}
        tabular = make_reader(path, **by_split, **reader_options(context, data.batch_size, split == "train"))
        tabular.check_first_rows()  # A wrong delimiter or column stops the run now, not after training.
        return tabular

    train_reader, valid_reader = reader(train_path, "train"), reader(valid_path, "valid")
    splits = {} if data.test_path is None else {"test": reader(resolve_path(data.test_path), "test")}

    model = build_zoo_model(
        config.model, _tables(data), data.sparse_features, len(data.dense_columns), gangs.dp, config.seed
    )
    for mlp in (getattr(model, name, None) for name in ("mlp", "top_mlp")):
        if mlp is not None:
            tensor_parallel_mlp(mlp, gangs)
    return click_prediction_parts(context, model, train_reader, valid_reader, splits)


def _tables(data: TabularDataSection) -> list[TableSpec]:
    """One table per categorical column, or one per group with a ``shared_table``; multi-hot bags pool by mean.
    libSVM/libFFM: one table per field (weighted sums of the tokens' rows)."""
    if data.format in LIBSVM_FORMATS:
        return [TableSpec(name, data.libsvm_buckets, (name,)) for name in data.sparse_features]
    tables = []
    for group in data.categorical:
        pooling: Literal["sum", "mean"] = "mean" if group.multi_hot else "sum"
        if group.shared_table is not None:
            tables.append(TableSpec(group.shared_table, group.num_buckets, tuple(group.columns), pooling))
        else:
            tables += [TableSpec(name, group.num_buckets, (name,), pooling) for name in group.columns]
    return tables
