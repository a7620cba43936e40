"""The ``dlrm`` recipe: DLRM on click logs in the Criteo format (real day files, or synthetic ones)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Annotated

from recipes import (
    ConfigError,
    GlobalBatchSize,
    NonNegativeInt,
    PositiveInt,
    Range,
    RecipeConfig,
    RecipeContext,
    RecipeParts,
    parse_threads,
    reader_options,
    register_recipe,
)
from recsys.builtin.dlrm.criteo import NUM_DENSE_FEATURES, SPARSE_FEATURE_NAMES, criteo_schema, table_sizes
from recsys.builtin.dlrm.criteo_synthetic import write_synthetic_criteo
from recsys.click.models import DLRM
from recsys.click.units import click_prediction_parts
from recsys.models.embeddings import (
    EmbeddingSection,
    TableSpec,
    build_embeddings,
)
from recsys.tabular.formats.delimited_text import TabularReader
from recsys.tabular.schema import with_full_keys


@dataclass
class CriteoDataSection:
    """Criteo day files (``label<TAB>I1..I13<TAB>C1..C26``), read streaming by the ``tabular`` recipe's reader with
    the Criteo schema (``recsys.builtin.dlrm.criteo.criteo_schema``): a categorical value's id is its stable hash
    modulo its table (an empty field is id 0), a count becomes ``log(max(x, 0) + 1)`` (empty: 0), as in DLRM. Every
    rank parses every line and keeps its share (row ``i`` of a global step goes to DP rank ``i % dp_size``), and an
    epoch ends for all ranks at the last whole global step. ``python -m recsys.builtin.dlrm.criteo_synthetic PATH
    --num-rows N`` writes synthetic data in this format."""

    train_path: str | None = None
    """Training day files: an fsspec path or glob, plain or gzip (``/data/criteo/train/day_*.gz``)."""
    valid_path: str | None = None
    """Validation day files, as ``train_path``."""
    test_path: str | None = None
    """Optional test day files, which ``eval``/``predict --split test`` score."""
    synthetic_rows: Annotated[int, Range(ge=4)] | None = None
    """Instead of paths: write this many synthetic training rows (and a quarter as many for
    validation, and for test) under ``OUTPUT_DIR/data`` and train on them."""
    num_embeddings_per_feature: list[Annotated[int, Range(ge=2)]] = field(default_factory=lambda: [100_000])
    """Table rows of the 26 categorical features C1-C26: one value for all, or 26. A value's id is
    ``1 + hash(text) % (rows - 1)`` (``recsys.tabular.hashing``); an empty field's is 0."""
    batch_size: GlobalBatchSize = 2048
    """The global batch size of a micro-batch, split evenly over the data-parallel ranks."""
    shuffle_buffer_size: PositiveInt = 65_536
    """Rows shuffled together: a bounded window, so memory does not grow with the files."""
    max_malformed_rows: NonNegativeInt = 100
    """Malformed rows skipped in an epoch (each logged with its file and line) before a data error stops the run."""
    parse_threads: PositiveInt | None = None
    """Threads that parse the chunks after the one being batched, meanwhile (the rows are the same, in the same
    order), at most the cores the process may run on: for a run whose reading is the bottleneck, with cores to
    spare. ``None``: 1 on a CPU; on a GPU the rank's share of the cores less 2, at most 4
    (``recipes.parse_threads``)."""

    def __post_init__(self) -> None:
        table_sizes(self.num_embeddings_per_feature)  # One value or 26, each at least 2.


@dataclass
class DLRMModelSection:
    embeddings: EmbeddingSection = field(default_factory=EmbeddingSection)
    bottom_dims: list[PositiveInt] = field(default_factory=lambda: [64, 32])
    """Hidden layers of the dense-feature MLP; its output has the embedding dimension."""
    top_dims: list[PositiveInt] = field(default_factory=lambda: [64, 32])
    """Hidden layers of the MLP over the interactions."""
    shared_table: bool = False
    """One table looked up by all 26 features, instead of one table per feature."""


@dataclass
class DLRMConfig(RecipeConfig):
    model: DLRMModelSection = field(default_factory=DLRMModelSection)
    dataset: CriteoDataSection = field(default_factory=CriteoDataSection)


@register_recipe("dlrm", DLRMConfig, "DLRM on Criteo-format click logs, with sharded sparse tables.")
def build_dlrm(context: RecipeContext[DLRMConfig]) -> RecipeParts:
    config, gangs = context.config, context.gangs
    data, section = config.dataset, config.model.embeddings
    train_path, valid_path, test_path = _data_paths(context)

    sizes = table_sizes(data.num_embeddings_per_feature)
    if config.model.shared_table:
        tables = [TableSpec("shared", max(sizes), SPARSE_FEATURE_NAMES)]
        sizes = [max(sizes)] * len(sizes)
    else:
        tables = [TableSpec(name, size, (name,)) for name, size in zip(SPARSE_FEATURE_NAMES, sizes)]
    schema = criteo_schema(sizes)
    if section.kind == "hash":  # every value keeps its full 64-bit key; the sizes are the tables' capacities
        schema = with_full_keys(schema)

    def reader(path: str, train: bool) -> TabularReader:
        criteo = TabularReader(
            path,
            schema,
            shuffle_buffer_size=data.shuffle_buffer_size,
            max_malformed_rows=data.max_malformed_rows,
            parse_threads=parse_threads(data.parse_threads, context.device),
            **reader_options(context, data.batch_size, train),
        )
        criteo.check_first_rows()  # A file of another format stops the run now, before the tables are built.
        return criteo

    train_reader, valid_reader = reader(train_path, train=True), reader(valid_path, train=False)
    splits = {} if test_path is None else {"test": reader(test_path, train=False)}

    embeddings = build_embeddings(section, tables, gangs.dp, config.seed)
    model = DLRM(
        embeddings,
        list(SPARSE_FEATURE_NAMES),
        NUM_DENSE_FEATURES,
        section.dim,
        config.model.bottom_dims,
        config.model.top_dims,
    ).to(context.device)
    # Every categorical column holds one value per row, of a number only the data knows.
    columns = dict.fromkeys(SPARSE_FEATURE_NAMES, None)
    return click_prediction_parts(context, model, train_reader, valid_reader, splits, columns=columns)


def _data_paths(context: RecipeContext[DLRMConfig]) -> tuple[str, str, str | None]:
    """The configured day files, or synthetic ones written (once, by rank 0) under ``OUTPUT_DIR/data``."""
    data = context.config.dataset
    if data.synthetic_rows is None:
        if data.train_path is None or data.valid_path is None:
            raise ConfigError(
                "`dataset.train_path` and `dataset.valid_path` must name Criteo-format files "
                "(or set `dataset.synthetic_rows`), but are not set."
            )
        return data.train_path, data.valid_path, data.test_path
    folder = os.path.join(context.output_dir, "data")
    paths = {split: f"{folder}/{split}.tsv.gz" for split in ("train", "valid", "test")}
    rows = {"train": data.synthetic_rows, "valid": data.synthetic_rows // 4, "test": data.synthetic_rows // 4}
    if context.gangs.root.rank == 0:
        for seed, (split, path) in enumerate(paths.items()):
            if not os.path.exists(path):
                os.makedirs(folder, exist_ok=True)
                partial = path.replace(".tsv.gz", ".partial.tsv.gz")  # Complete or absent, like a checkpoint.
                write_synthetic_criteo(partial, rows[split], seed=seed, model_seed=context.config.seed)
                os.replace(partial, path)
    context.gangs.root.barrier()
    return paths["train"], paths["valid"], paths["test"]
