"""The zoo's test data and recipe: rows whose label only the interaction of two ids predicts (``XorData``), and
``zoo_test``, a recipe of any zoo model over them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Protocol

import torch
from torch import nn

from embedding import CombinedOptimizer, JaggedIds, SparseFeatures, SparseOptimizer
from recipes.config.presets import register_preset, register_recipe
from recipes.config.sections import RecipeConfig
from recipes.training.parts import RecipeContext, RecipeParts
from recipes.training.sparse_tables import find_sparse_tables
from recsys.click.batch import CTRBatch
from recsys.click.units import click_prediction_parts
from recsys.data.memory import InMemoryReader
from recsys.models.embeddings import TableSpec
from recsys.zoo import ZOO_MODELS, ZooEmbeddingSection, ZooModelConfig, build_zoo_model
from units import BinaryAUC

NUM_IDS, NUM_TAGS, NUM_DENSE = 20, 6, 2
TABLES = [
    TableSpec("a", NUM_IDS, ("a",)),
    TableSpec("b", NUM_IDS, ("b",)),
    TableSpec("tags", NUM_TAGS, ("tags",), pooling="mean"),
]
FEATURES = ["a", "b", "tags"]
Backend = Literal["sparse", "dense"]
ZOO_MODEL_NAMES = [
    name
    for name in ZOO_MODELS.names()
    if not ZOO_MODELS.get(name).config_class.reads_sequences
    and not getattr(ZOO_MODELS.get(name).config_class, "retrieval", False)
    and ZOO_MODELS.get(name).config_class.min_tasks == 1
]
"""The click models that pool every feature and learn one label, which the data here suit (``support.sequence_data``
has the sequence models' data, ``tests/unit/recsys/zoo/test_multitask_models.py`` the multi-task models' tests)."""


def small_section(name: str, backend: Backend = "sparse", dim: int = 4, **kwargs: Any) -> ZooModelConfig:
    """Model ``name``'s config, small: narrow MLPs (where it has them) and dim-4 tables."""
    config_class = ZOO_MODELS.get(name).config_class
    options = {"hidden_dims": [16, 8], "bottom_dims": [8], **kwargs}
    takes = {f.name for f in dataclasses.fields(config_class)}
    embeddings = ZooEmbeddingSection(dim=dim, backend=backend)
    config: ZooModelConfig = config_class(
        name=name, embeddings=embeddings, **{key: value for key, value in options.items() if key in takes}
    )
    return config


def optimizer(model: nn.Module, lr: float = 0.01) -> CombinedOptimizer | torch.optim.Optimizer:
    """Adam over the dense parameters, and the fused sparse optimizer over every table of the model."""
    dense = torch.optim.Adam(model.parameters(), lr=lr)
    tables = list(find_sparse_tables(model).values())
    return CombinedOptimizer(dense, SparseOptimizer(tables)) if tables else dense


class Rows(Protocol):
    """Generated rows that a test draws batches of, by row index."""

    def __len__(self) -> int: ...

    def batch(self, rows: torch.Tensor) -> CTRBatch: ...


def train_and_score(model: nn.Module, train: Rows, test: Rows, steps: int, lr: float = 0.01) -> float:
    """The test AUC of ``model`` after ``steps`` steps of 64 rows of ``train`` drawn at random (seeded), BCE under
    ``optimizer``."""
    step = optimizer(model, lr=lr)
    generator = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(steps):
        batch = train.batch(torch.randint(0, len(train), (64,), generator=generator))
        nn.functional.binary_cross_entropy_with_logits(model(batch), batch.labels).backward()
        step.step()
        step.zero_grad()
    model.eval()
    auc = BinaryAUC()
    with torch.no_grad():
        batch = test.batch(torch.arange(len(test)))
        auc.update(torch.sigmoid(model(batch)), batch.labels.long())
    return float(auc.compute())


@dataclass(frozen=True)
class XorData:
    """Rows whose label is the XOR of the parities of ids ``a`` and ``b``: no weight per id predicts it
    (every id is positive half the time), only their interaction does. ``tags`` (0 to 3 ids per row,
    multi-hot) and the dense features are noise."""

    a: torch.Tensor
    b: torch.Tensor
    tag_ids: torch.Tensor
    tag_offsets: torch.Tensor
    dense: torch.Tensor
    labels: torch.Tensor

    @classmethod
    def make(cls, num_rows: int, seed: int) -> XorData:
        generator = torch.Generator().manual_seed(seed)
        a = torch.randint(0, NUM_IDS, (num_rows,), generator=generator)
        b = torch.randint(0, NUM_IDS, (num_rows,), generator=generator)
        lengths = torch.randint(0, 4, (num_rows,), generator=generator)
        tag_ids = torch.randint(0, NUM_TAGS, (int(lengths.sum()),), generator=generator)
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        dense = torch.randn(num_rows, NUM_DENSE, generator=generator)
        return cls(a, b, tag_ids, offsets, dense, ((a % 2) ^ (b % 2)).float())

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, rows: torch.Tensor) -> CTRBatch:
        starts, lengths = self.tag_offsets[rows], torch.diff(self.tag_offsets)[rows]
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        positions = torch.repeat_interleave(starts - offsets[:-1], lengths) + torch.arange(int(offsets[-1]))
        sparse = SparseFeatures(
            {
                "a": JaggedIds.from_dense(self.a[rows, None]),
                "b": JaggedIds.from_dense(self.b[rows, None]),
                "tags": JaggedIds(self.tag_ids[positions], offsets),
            }
        )
        return CTRBatch(self.dense[rows], sparse, self.labels[rows])


@dataclass
class ZooTestConfig(RecipeConfig):
    model: Annotated[ZooModelConfig, ZOO_MODELS] = field(default_factory=ZOO_MODELS.default("dcn_v2"))


def build_zoo_recipe(context: RecipeContext[ZooTestConfig]) -> RecipeParts:
    config, dp = context.config, context.gangs.dp
    train, valid = XorData.make(512, seed=0), XorData.make(100, seed=1)
    model = build_zoo_model(config.model, TABLES, FEATURES, NUM_DENSE, dp, config.seed)
    readers = [
        InMemoryReader(data.batch, len(data), batch_size=32, dp_rank=dp.rank, dp_size=dp.size, **kwargs)
        for data, kwargs in ((train, {"seed": config.seed}), (valid, {"shuffle": False, "drop_last": False}))
    ]
    return click_prediction_parts(context, model, readers[0], readers[1])


def register_zoo_recipe() -> None:
    """Register the recipe ``zoo_test`` and its preset: 6 steps, metrics every 3, checkpoints at steps 3 and 6."""
    register_recipe("zoo_test", ZooTestConfig)(build_zoo_recipe)
    register_preset(
        "zoo_test",
        "zoo_test",
        {
            "trainer": {"max_num_steps": 6, "publish_metrics_every_n_steps": 3, "score_metric": "auc"},
            "model": {"embeddings": {"dim": 4}, "hidden_dims": [16]},  # fm and logistic_regression drop it
            "checkpoint": {"every_n_steps": 3},
        },
    )
