"""Rows whose label one feature determines and another does not touch (``SignalNoiseData``), and
``signal_noise``, a click recipe over them: what permutation importance must rank right."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from embedding import JaggedIds, SparseFeatures
from recipes.config.presets import register_preset, register_recipe
from recipes.config.sections import RecipeConfig
from recipes.training.parts import RecipeContext, RecipeParts
from recsys.click.batch import CTRBatch
from recsys.click.models import CTRModel
from recsys.click.units import click_prediction_parts
from recsys.data.memory import InMemoryReader
from recsys.models.embeddings import EmbeddingSection, TableSpec, build_embeddings

NUM_IDS = 20
FEATURES = ["signal", "noise"]
FLIPPED = 0.1
"""The share of rows whose label is the other parity: the model cannot be perfect, so NE means something."""


@dataclass(frozen=True)
class SignalNoiseData:
    """The label is the parity of ``signal``'s id (a tenth of the rows flipped); ``noise``'s id, its bag of 0 to 3
    ``tags`` and the one dense column are drawn apart from it."""

    signal: torch.Tensor
    noise: torch.Tensor
    tag_ids: torch.Tensor
    tag_offsets: torch.Tensor
    dense: torch.Tensor
    labels: torch.Tensor

    @classmethod
    def make(cls, num_rows: int, seed: int) -> SignalNoiseData:
        generator = torch.Generator().manual_seed(seed)
        signal = torch.randint(0, NUM_IDS, (num_rows,), generator=generator)
        noise = torch.randint(0, NUM_IDS, (num_rows,), generator=generator)
        lengths = torch.randint(0, 4, (num_rows,), generator=generator)
        tag_ids = torch.randint(0, NUM_IDS, (int(lengths.sum()),), generator=generator)
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        dense = torch.randn(num_rows, 1, generator=generator)
        flipped = torch.rand(num_rows, generator=generator) < FLIPPED
        return cls(signal, noise, tag_ids, offsets, dense, ((signal % 2 == 1) ^ flipped).float())

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, rows: torch.Tensor) -> CTRBatch:
        starts, lengths = self.tag_offsets[rows], torch.diff(self.tag_offsets)[rows]
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        positions = torch.repeat_interleave(starts - offsets[:-1], lengths) + torch.arange(int(offsets[-1]))
        sparse = SparseFeatures(
            {
                "signal": JaggedIds.from_dense(self.signal[rows, None]),
                "noise": JaggedIds.from_dense(self.noise[rows, None]),
                "tags": JaggedIds(self.tag_ids[positions], offsets),
            }
        )
        return CTRBatch(self.dense[rows], sparse, self.labels[rows])


@dataclass
class SignalNoiseConfig(RecipeConfig):
    embeddings: EmbeddingSection = field(default_factory=lambda: EmbeddingSection(dim=4))


def build_signal_noise(context: RecipeContext[SignalNoiseConfig]) -> RecipeParts:
    """``CTRModel`` over the three sparse features and the dense column: 1,024 rows to train on, 1,000 to score."""
    config, dp = context.config, context.gangs.dp
    train, valid = SignalNoiseData.make(1024, seed=0), SignalNoiseData.make(1000, seed=1)
    tables = [TableSpec(name, NUM_IDS, (name,)) for name in ("signal", "noise", "tags")]
    embeddings = build_embeddings(config.embeddings, tables, dp, config.seed)
    model = CTRModel(embeddings, ["signal", "noise", "tags"], config.embeddings.dim, 1, [8]).to(context.device)
    readers = [
        InMemoryReader(data.batch, len(data), batch_size=64, dp_rank=dp.rank, dp_size=dp.size, **kwargs)
        for data, kwargs in ((train, {"seed": config.seed}), (valid, {"shuffle": False, "drop_last": False}))
    ]
    return click_prediction_parts(context, model, readers[0], readers[1])


def register_signal_noise() -> None:
    """Register the recipe ``signal_noise`` and its preset: 160 steps (10 epochs), one checkpoint at the end."""
    register_recipe("signal_noise", SignalNoiseConfig)(build_signal_noise)
    register_preset(
        "signal_noise",
        "signal_noise",
        {
            "trainer": {"max_num_steps": 160, "validate_every_n_steps": 80, "score_metric": "auc"},
            "optimizer": {"lr": 0.01},
            "checkpoint": {"every_n_steps": 160},
            "metrics": {"recorders": {"console": False}},
        },
    )
