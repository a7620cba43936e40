"""``two_tables``: a user's recipe whose model holds two sparse collections (one nested in a module dict) and no
wiring of its own, unless ``wiring.optimizer`` asks for a hand wiring that leaves the ``items`` table out; with
``wiring.extra_feature`` its batches carry a feature that no table looks up."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from embedding import CombinedOptimizer, SparseOptimizer
from embedding.features import JaggedIds, SparseFeatures
from recipes.config.presets import register_preset, register_recipe
from recipes.config.sections import RecipeConfig
from recipes.optimizers import build_optimizer
from recipes.training.parts import RecipeContext, RecipeParts
from recsys.data.memory import InMemoryReader
from recsys.models.embeddings import EmbeddingSection, TableSpec, build_embeddings
from units import MetricBag, TrainUnit

Batch = tuple[SparseFeatures, torch.Tensor]
NUM_ITEMS = 50


@dataclass
class WiringSection:
    optimizer: str = "auto"
    """``auto``: the framework wires the tables; ``skip_items``/``state_without_items``: a hand wiring
    that leaves the ``items`` table out of the optimizer or the checkpointed state."""
    extra_feature: bool = False
    """Batches carry a feature ``age`` that no table looks up."""


@dataclass
class TwoTableConfig(RecipeConfig):
    embeddings: EmbeddingSection = field(default_factory=EmbeddingSection)
    wiring: WiringSection = field(default_factory=WiringSection)


class TwoTables(nn.Module):
    """A user's model: two sparse collections (one nested) and a dense layer over them."""

    def __init__(self, section: EmbeddingSection, context: RecipeContext[TwoTableConfig]) -> None:
        super().__init__()
        gang, seed = context.gangs.dp, context.config.seed
        self.users = build_embeddings(section, [TableSpec("users", NUM_ITEMS, ("user",))], gang, seed)
        self.tower = nn.ModuleDict(
            {"item": build_embeddings(section, [TableSpec("items", NUM_ITEMS, ("item",))], gang, seed)}
        )
        self.head = nn.Linear(1, 1)

    def forward(self, features: SparseFeatures) -> torch.Tensor:
        dot = (self.users(features)["user"] * self.tower["item"](features)["item"]).sum(1, keepdim=True)
        logits: torch.Tensor = self.head(dot).squeeze(1)
        return logits


class ClickUnit(TrainUnit[Batch]):
    def __call__(self, batch: Batch) -> torch.Tensor:
        features, labels = batch
        return nn.functional.binary_cross_entropy_with_logits(self.model(features), labels, reduction="none")


def build_two_tables(context: RecipeContext[TwoTableConfig]) -> RecipeParts:
    generator = torch.Generator().manual_seed(0)
    users = torch.randint(0, NUM_ITEMS, (512,), generator=generator)
    items = torch.randint(0, NUM_ITEMS, (512,), generator=generator)
    labels = ((users + items) % 2).float()

    def make_batch(rows: torch.Tensor) -> Batch:
        features = {"user": JaggedIds.from_dense(users[rows, None]), "item": JaggedIds.from_dense(items[rows, None])}
        if context.config.wiring.extra_feature:
            features["age"] = JaggedIds.from_dense(users[rows, None])
        return SparseFeatures(features), labels[rows]

    model = TwoTables(context.config.embeddings, context)
    parts = RecipeParts(
        train_unit=ClickUnit(model, MetricBag(context.gangs.dp)),
        train_reader=InMemoryReader(make_batch, len(labels), batch_size=32, seed=context.config.seed),
    )
    wiring = context.config.wiring.optimizer
    if wiring == "skip_items":

        def only_users(wrapped: nn.Module) -> torch.optim.Optimizer:
            dense = build_optimizer(context.config.optimizer, wrapped.parameters())
            return CombinedOptimizer(dense, SparseOptimizer(model.users))  # type: ignore[arg-type]

        parts.make_optimizer = only_users
    elif wiring == "state_without_items":
        parts.sharded_state = {"users": model.users}  # type: ignore[dict-item]
    return parts


def register_two_tables() -> None:
    """Register the recipe and its preset ``two_tables``: 12 steps, checkpoints at steps 6 and 12."""
    register_recipe("two_tables", TwoTableConfig)(build_two_tables)
    register_preset(
        "two_tables",
        "two_tables",
        {"trainer": {"max_num_steps": 12, "publish_metrics_every_n_steps": 4}, "checkpoint": {"every_n_steps": 6}},
    )
