"""Sparse tables in a recipe of one's own: found in the model, stepped, checkpointed and reported by the
framework; hand wiring that leaves a table out stops the run at start-up."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from torch import nn

from embedding import CombinedOptimizer, EmbeddingTableConfig, ShardedEmbeddingCollection, SparseOptimizer
from embedding.features import JaggedIds, SparseFeatures
from gang import FakeGang
from recipes.cli import main
from recipes.optimizers import build_optimizer
from recipes.parts import RecipeContext, RecipeParts
from recipes.registry import register_preset, register_recipe
from recipes.sections import RecipeConfig
from recipes.sparse_tables import find_sparse_tables
from recsys.data.memory import InMemoryReader
from recsys.models.embeddings import DenseEmbeddingBags, EmbeddingSection, TableSpec, build_embeddings
from resume_helpers import load_verified
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
    def __call__(self, batch: Batch) -> tuple[torch.Tensor, int]:
        features, labels = batch
        loss = nn.functional.binary_cross_entropy_with_logits(self.model(features), labels, reduction="sum")
        return loss, len(labels)


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


@pytest.fixture
def two_tables(isolated_presets: Path) -> Path:
    register_recipe("two_tables", TwoTableConfig)(build_two_tables)
    register_preset(
        "two_tables",
        "two_tables",
        {"trainer": {"max_num_steps": 12, "publish_metrics_every_n_steps": 4}, "checkpoint": {"every_n_steps": 6}},
    )
    return isolated_presets


def test_a_recipe_without_wiring_steps_and_checkpoints_every_table(
    two_tables: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", "two_tables", "-o", "out"]) == 0
    out = capsys.readouterr().out

    assert "sparse table 'users' (model.users): 50 rows x 16" in out
    assert "sparse table 'items' (model.tower.item)" in out
    assert "rowwise_adagrad lr=0.05" in out
    rank_state = load_verified(two_tables / "out/checkpoints/step_12", "rank_0.pt")
    sharded = rank_state["sharded"]
    assert set(sharded) == {"users", "tower.item"}
    for key, table in (("users", "users"), ("tower.item", "items")):
        saved = sharded[key]["tables"][table]
        initial = (
            ShardedEmbeddingCollection([EmbeddingTableConfig(table, NUM_ITEMS, 16, (table[:-1],))], seed=2)
            .shards[table]
            .weight
        )
        assert not torch.equal(saved["weight"], initial), f"table {table} was never updated"
        assert set(saved["optimizer_state"]) == {"sum"}  # rowwise Adagrad: one sum per row


@pytest.mark.parametrize(
    ("wiring", "fragment"),
    [
        ("skip_items", "must be stepped by the optimizer"),
        ("state_without_items", "must be in `RecipeParts.sharded_state`"),
    ],
)
def test_hand_wiring_that_leaves_a_table_out_stops_at_start_up(
    two_tables: Path, capsys: pytest.CaptureFixture[str], wiring: str, fragment: str
) -> None:
    code = main(["train", "two_tables", "-o", "out", f"wiring.optimizer={wiring}"])
    err = capsys.readouterr().err

    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    assert "sparse table 'items' (model.tower.item)" in lines[0] and fragment in lines[0]
    assert not (two_tables / "out" / "checkpoints").exists() or not any((two_tables / "out" / "checkpoints").iterdir())


def test_a_batch_feature_that_no_table_looks_up_is_one_line_and_exit_2(
    two_tables: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["train", "two_tables", "-o", "out", "wiring.extra_feature=true"])
    err = capsys.readouterr().err

    assert code == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "'age' is looked up by none (the tables look up item, user)" in err


def test_tables_are_found_through_nested_modules_by_path() -> None:
    section = EmbeddingSection()
    users = build_embeddings(section, [TableSpec("users", 4, ("user",))], FakeGang(), 0)
    model = nn.Sequential(nn.ModuleDict({"towers": nn.ModuleList([users])}), nn.Linear(1, 1))

    assert find_sparse_tables(model) == {"0.towers.0": users}


def test_dense_tables_start_from_the_values_of_the_sparse_ones() -> None:
    tables = [TableSpec("movies", 30, ("movie",)), TableSpec("users", 70_000, ("user",))]
    section = EmbeddingSection(dim=8)

    dense = DenseEmbeddingBags(tables, section.dim, seed=5)
    sparse = build_embeddings(section, tables, FakeGang(), seed=5)

    for table in tables:
        assert torch.equal(dense.bags[table.name].weight.detach(), sparse.shards[table.name].weight)  # type: ignore[union-attr,index]
