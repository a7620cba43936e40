"""Sparse tables in a recipe of one's own: found through nested modules, dense tables started from the sparse
ones' values, and hand wiring that leaves a table out stopping the run at start-up."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from gang import FakeGang
from recipes.cli import main
from recipes.sparse_tables import find_sparse_tables
from recsys.models.embeddings import DenseEmbeddingBags, EmbeddingSection, TableSpec, build_embeddings


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
