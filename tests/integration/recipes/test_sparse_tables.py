"""Sparse tables in a recipe of one's own, trained through the CLI: found in the model, stepped, checkpointed and
reported by the framework; a batch feature that no table looks up stops the run in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from embedding import EmbeddingTableConfig, ShardedEmbeddingCollection
from recipes.cli.main import main
from support.resume_helpers import load_verified
from support.two_tables import NUM_ITEMS


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


def test_a_batch_feature_that_no_table_looks_up_is_one_line_and_exit_2(
    two_tables: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["train", "two_tables", "-o", "out", "wiring.extra_feature=true"])
    err = capsys.readouterr().err

    assert code == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "'age' is looked up by none (the tables look up item, user)" in err
