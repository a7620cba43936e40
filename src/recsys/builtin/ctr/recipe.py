"""The ``ctr`` recipe: a small click-through-rate model on deterministic synthetic data."""

from __future__ import annotations

from dataclasses import dataclass, field

from recipes import (
    GlobalBatchSize,
    PositiveInt,
    RecipeConfig,
    RecipeContext,
    RecipeParts,
    Seed,
    reader_options,
    register_recipe,
)
from recsys.builtin.ctr.synthetic import SyntheticCTRData
from recsys.click.models import CTRModel
from recsys.click.units import click_prediction_parts
from recsys.data.memory import InMemoryReader
from recsys.models.embeddings import (
    EmbeddingSection,
    TableSpec,
    build_embeddings,
)


@dataclass
class CTRModelSection:
    embeddings: EmbeddingSection = field(default_factory=EmbeddingSection)
    hidden_dims: list[PositiveInt] = field(default_factory=lambda: [64, 32])
    """Hidden layers of the MLP over the concatenated features."""


@dataclass
class SyntheticDataSection:
    num_train_samples: PositiveInt = 32768
    """Training samples."""
    num_valid_samples: PositiveInt = 8192
    """Validation samples, of the same click model."""
    num_dense: PositiveInt = 4
    """Dense features."""
    num_sparse: PositiveInt = 4
    """Categorical features, one table each."""
    vocab_size: PositiveInt = 1000
    """Categories per feature (Zipf-distributed)."""
    batch_size: GlobalBatchSize = 256
    """The global batch size of a micro-batch, split evenly over the data-parallel ranks."""
    data_seed: Seed = 7
    """The data's own seed, apart from the training ``seed``, so that changing one keeps the other."""


@dataclass
class CTRConfig(RecipeConfig):
    model: CTRModelSection = field(default_factory=CTRModelSection)
    dataset: SyntheticDataSection = field(default_factory=SyntheticDataSection)


@register_recipe("ctr", CTRConfig, "Click-through-rate MLP over embedding bags, on synthetic data.")
def build_ctr(context: RecipeContext[CTRConfig]) -> RecipeParts:
    config, dp = context.config, context.gangs.dp
    data = config.dataset
    num_samples = data.num_train_samples + data.num_valid_samples
    samples = SyntheticCTRData(num_samples, data.num_dense, data.num_sparse, data.vocab_size, data.data_seed)
    train, valid = (
        samples.split(0, data.num_train_samples),
        samples.split(data.num_train_samples, num_samples),
    )
    features = [f"cat_{i}" for i in range(data.num_sparse)]
    section = config.model.embeddings
    tables = [TableSpec(name, data.vocab_size, (name,)) for name in features]
    embeddings = build_embeddings(section, tables, dp, config.seed)
    model = CTRModel(embeddings, features, section.dim, data.num_dense, config.model.hidden_dims)
    model.to(context.device)
    train_reader = InMemoryReader(train.batch, len(train), **reader_options(context, data.batch_size, train=True))
    valid_reader = InMemoryReader(valid.batch, len(valid), **reader_options(context, data.batch_size, train=False))
    # Every feature holds one id per row, of `vocab_size` values: any may group or slice the metrics.
    columns = dict.fromkeys(features, data.vocab_size)
    return click_prediction_parts(context, model, train_reader, valid_reader, columns=columns)
