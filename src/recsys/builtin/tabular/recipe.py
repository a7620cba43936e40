"""The ``tabular`` recipe: a ``dataset`` schema in YAML, a zoo model by ``model.name``, no Python of the user's."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field, replace
from typing import Annotated, Any

import pyarrow as pa

from recipes import (
    ConfigError,
    DataReader,
    RecipeConfig,
    RecipeContext,
    RecipeParts,
    parse_threads,
    reader_options,
    register_recipe,
)
from recsys.builtin.tabular.retrieval import check_retrieval_config, is_retrieval, tabular_retrieval_parts
from recsys.click.batch import CTRBatch
from recsys.click.metric_columns import metric_columns
from recsys.click.units import click_prediction_parts
from recsys.data.stream import StreamingReader
from recsys.tabular.added_columns import RowOrders
from recsys.tabular.cardinality import count_table_ids, load_or_count_cardinalities
from recsys.tabular.formats.data_format import ColumnFormat, DataFormat, data_format
from recsys.tabular.schema import HISTORY, TabularDataSection, resolve_path, with_full_keys
from recsys.tabular.schema_metric_columns import single_valued_columns, value_names
from recsys.tabular.split_files import refuse_unlocated_paths
from recsys.tabular.value_texts import feature_value_texts
from recsys.tabular.vocabulary import Encodings, load_or_build_encodings
from recsys.tabular.window_sources import windowed_train_reader
from recsys.zoo import ZOO_MODELS, ZooModelConfig, build_zoo_model, check_num_tasks, check_table_dims

logger = logging.getLogger(__name__)

ENCODINGS_FILE = "vocabularies.npz"
"""The vocabularies and value counts counted at the first start (named before counts joined them)."""
CARDINALITIES_FILE = "cardinalities.json"
"""The distinct ids of each table, counted at the first start when the model sizes its tables by them."""


@dataclass
class TabularConfig(RecipeConfig):
    model: Annotated[ZooModelConfig, ZOO_MODELS] = field(default_factory=ZOO_MODELS.default("dcn_v2"))
    dataset: TabularDataSection = field(default_factory=TabularDataSection)


@register_recipe("tabular", TabularConfig, "Click prediction on files declared by a schema, with a zoo model.")
def build_tabular(context: RecipeContext[TabularConfig]) -> RecipeParts:
    config, gangs = context.config, context.gangs
    data = config.dataset
    if data.train_path is None or data.valid_path is None:
        raise ConfigError("`dataset.train_path` and `dataset.valid_path` must name files, but are not set.")
    # A pattern of windows may match nothing yet (`follow` waits for them): the windows' own messages tell.
    named = ("train", "valid", "test") if data.windows.by == "none" else ("valid", "test")
    located = {f"dataset.{split}_path": getattr(data, f"{split}_path") for split in named}
    refuse_unlocated_paths(
        located | {f"dataset.joins[{k}].path": join.path for k, join in enumerate(data.joins)}, data.data_dir
    )
    metric_columns(config, single_valued_columns(data, None))  # A column the schema lacks stops before any reading.
    tasks = data.tasks
    check_num_tasks(config.model, len(tasks or ()) or 1, tasks or ())
    if is_retrieval(config.model):
        check_retrieval_config(context)
    features = data_format(data)
    tables = features.tables()
    check_table_dims(config.model.embeddings, tables)

    # Hash tables take each value's full 64-bit key; `num_buckets` then sizes them (the format's `tables`).
    files = data_format(with_full_keys(data) if config.model.embeddings.kind == "hash" else data)
    options: dict[str, Any] = {
        "shuffle_buffer_size": data.shuffle_buffer_size,
        "max_malformed_rows": data.max_malformed_rows,
        "parse_threads": parse_threads(data.parse_threads, context.device),
    }
    # Vocabularies, counts and histories are of the schema's columns, which a format of its own features lacks.
    train_path = resolve_path(data.train_path)
    encodings = _encodings(context, files, train_path, options) if isinstance(files, ColumnFormat) else None

    def reader(path: str, split: str) -> StreamingReader[CTRBatch]:
        options_of_split = {**options, **reader_options(context, data.batch_size, split == "train")}
        tabular = files.reader(path, split=split, encodings=encodings, **options_of_split)
        tabular.check_first_rows()  # A wrong delimiter or column stops the run now, not after training.
        return tabular

    def window_reader(window_files: DataFormat, paths: list[str], split: str, train: bool) -> StreamingReader[CTRBatch]:
        # A window's last, smaller step is trained on too: a window of a few rows is still learnt from.
        options_of_split = {**options, **reader_options(context, data.batch_size, train), "drop_last": False}
        tabular = window_files.reader(paths, split=split, encodings=encodings, **options_of_split)
        tabular.check_first_rows()
        return tabular

    if data.windows.by == "none":
        train_reader: DataReader[CTRBatch] = reader(train_path, "train")
    else:  # One window after another, each scored before it is trained on (`recsys.tabular.window_sources`).
        # Windows by column are written one file each, by every rank in its own folder (no rank waits for another).
        folder = os.path.join(context.output_dir, "windows", f"rank_{gangs.root.rank}")
        train_reader = windowed_train_reader(data, files, train_path, window_reader, folder)
    valid_reader = reader(resolve_path(data.valid_path), "valid")
    splits = {} if data.test_path is None else {"test": reader(resolve_path(data.test_path), "test")}

    cardinalities = None
    if config.model.embeddings.dim_by_cardinality:
        counting = {**options, "batch_size": 65_536, "shuffle": False, "drop_last": False}
        cardinalities = load_or_count_cardinalities(
            os.path.join(context.output_dir, CARDINALITIES_FILE),
            tables,
            lambda: count_table_ids(files.reader(train_path, split="train", encodings=encodings, **counting), tables),
        )
    num_dense = len(data.dense_columns)
    model = build_zoo_model(
        config.model,
        tables,
        features.sparse_features(),
        num_dense,
        gangs.dp,
        config.seed,
        cardinalities,
        num_tasks=len(tasks or ()) or 1,
        sequence_lengths=features.sequence_lengths(),
        tasks=tasks or (),
    )
    if is_retrieval(config.model):
        readers = (train_reader, valid_reader, splits)
        parts = tabular_retrieval_parts(context, model, files, encodings, options, readers)
    else:  # Any single-valued categorical column of the schema may group or slice the validation metrics.
        slice_by, full_keys = config.metrics.slice_by, config.model.embeddings.kind == "hash"
        names = {} if slice_by is None else value_names(data, slice_by, encodings, full_keys)
        columns = single_valued_columns(data, encodings)
        parts = click_prediction_parts(context, model, train_reader, valid_reader, splits, columns, names, tasks)
    if not isinstance(files, ColumnFormat):
        return parts

    def value_texts() -> dict[str, pa.Table]:
        """The texts of the training files' values, beside their ids, for ``export`` (none where the format cannot
        read them)."""
        every_row = files.reader(train_path, split="all", encodings=encodings, batch_size=1, **options)
        try:
            return feature_value_texts(files.schema, every_row, encodings)
        except NotImplementedError as reason:
            logger.warning("The export holds no texts beside the ids: %s", reason)
            return {}

    return replace(parts, value_texts=value_texts)


def _encodings(
    context: RecipeContext[TabularConfig], files: ColumnFormat, train_path: str, options: dict[str, Any]
) -> Encodings:
    """The vocabularies and value counts of the schema's columns (counted in one pass over the training files at the
    first start, and saved in the output directory), and their histories and a leave-one-out split's events
    (gathered at every start, before the counts, which count the training rows that the events tell)."""
    data = context.config.dataset
    orders = RowOrders({})
    if any(derived.transform == HISTORY for derived in data.derived) or data.split.last_of is not None:
        # Every configured file, each once, every row: a validation row's history holds its earlier
        # validation rows too, as a deployed model's would; a user's last rows may be in any file.
        paths = [resolve_path(path) for path in (data.train_path, data.valid_path, data.test_path) if path]
        every_row = files.reader(list(dict.fromkeys(paths)), split="all", encodings=None, batch_size=1, **options)
        orders = every_row.row_orders()
        data.split.refuse_empty_splits(orders.split_values, scores_test=data.test_path is not None)
    ranked = Encodings({}, {}, ranks=orders.ranks)
    encodings = load_or_build_encodings(
        os.path.join(context.output_dir, ENCODINGS_FILE),
        files.schema,
        lambda: files.reader(train_path, split="train", encodings=ranked, batch_size=1, **options).count_values(),
    )
    return replace(encodings, histories=orders.histories, ranks=orders.ranks)
