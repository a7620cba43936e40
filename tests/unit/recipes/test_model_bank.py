"""The model bank (``checkpointing.model_bank``): what a source selects, renames and loads, with table rows by id."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from checkpoint import CheckpointManager
from embedding import EmbeddingTableConfig, JaggedIds, ShardedEmbeddingCollection, SparseFeatures
from gang import FakeGang
from recipes.checkpointing.left_out import SaveFilter
from recipes.checkpointing.model_bank import ModelBank, ModelBankError, load_source
from recipes.config.sections import ModelBankSource


class Model(nn.Module):
    def __init__(self, seed: int, fixed: str = "user") -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.mlp = nn.Linear(4, 2)
        tables = [
            EmbeddingTableConfig(fixed, 10, 4, ("f_user",)),
            EmbeddingTableConfig("item", 16, 4, ("f_item",), kind="hash"),
        ]
        self.embeddings = ShardedEmbeddingCollection(tables, seed=seed)

    def see(self, item_ids: list[int]) -> None:
        """Give the hash table rows for ``item_ids`` (a training lookup admits them)."""
        ids = torch.tensor(item_ids)
        features = {"f_user": JaggedIds.from_dense(torch.zeros(len(ids), 1, dtype=torch.int64))}
        features["f_item"] = JaggedIds.from_dense(ids.unsqueeze(1))
        self.embeddings.train()
        self.embeddings(SparseFeatures(features))

    @property
    def sharded(self) -> dict[str, ShardedEmbeddingCollection]:
        return {"embeddings": self.embeddings}


def item_rows(model: Model) -> dict[int, torch.Tensor]:
    piece = model.embeddings.sharded_state_dict()["tables"]["item"]
    return {int(key): row for key, row in zip(piece["index"]["keys"], piece["weight"], strict=True)}


def fixed_rows(model: Model, table: str = "user") -> torch.Tensor:
    weight: torch.Tensor = model.embeddings.sharded_state_dict()["tables"][table]["weight"]
    return weight.clone()


def save(model: Model, root: Path, step: int) -> None:
    manager = CheckpointManager(str(root / "checkpoints"), FakeGang(), clean_up=False)
    sharded = {"embeddings": model.embeddings.sharded_state_dict()}
    manager.save(step, {"model": model.state_dict()}, {"sharded": sharded}, model_only=True)


@pytest.fixture
def source(tmp_path: Path) -> tuple[Model, Path]:
    model = Model(seed=1)
    model.see([3, 4])
    save(model, tmp_path / "source", 5)
    return model, tmp_path / "source"


def load(path: Path, target: Model, **options: object) -> None:
    load_source(ModelBankSource(path=str(path), **options), target, target.sharded, FakeGang(), "bank[0]")  # type: ignore[arg-type]


def test_a_source_loads_its_parameters_and_both_kinds_of_table_with_their_ids(source: tuple[Model, Path]) -> None:
    model, path = source
    target = Model(seed=2)
    target.see([1, 2, 3])
    own_rows = item_rows(target)

    load(path, target)

    assert torch.equal(target.mlp.weight, model.mlp.weight)
    assert torch.equal(fixed_rows(target), fixed_rows(model))
    rows = item_rows(target)
    assert sorted(rows) == [1, 2, 3, 4]  # Merged: the run's own ids stay, the source's win where both have one.
    for key in (3, 4):
        assert torch.equal(rows[key], item_rows(model)[key])
    for key in (1, 2):
        assert torch.equal(rows[key], own_rows[key])


def test_reset_tables_clears_a_hash_table_before_it_loads(source: tuple[Model, Path]) -> None:
    model, path = source
    target = Model(seed=2)
    target.see([1, 2, 3])

    load(path, target, reset_tables=["embeddings.item"])

    rows = item_rows(target)
    assert sorted(rows) == [3, 4]
    assert all(torch.equal(rows[key], item_rows(model)[key]) for key in rows)


def test_exclude_leaves_the_run_s_own_values(source: tuple[Model, Path]) -> None:
    _, path = source
    target = Model(seed=2)
    before_mlp, before_user = target.mlp.weight.detach().clone(), fixed_rows(target)

    load(path, target, exclude=["mlp.*", "embeddings.user"])

    assert torch.equal(target.mlp.weight, before_mlp)
    assert torch.equal(fixed_rows(target), before_user)
    assert sorted(item_rows(target)) == [3, 4]


def test_rename_loads_a_source_table_under_another_name(source: tuple[Model, Path]) -> None:
    model, path = source
    target = Model(seed=2, fixed="user_v2")

    load(path, target, load=["embeddings.user"], rename={"embeddings.user": "embeddings.user_v2"})

    assert torch.equal(fixed_rows(target, "user_v2"), fixed_rows(model))


def test_a_load_glob_that_matches_nothing_is_refused_unless_missing_is_ignored(source: tuple[Model, Path]) -> None:
    _, path = source
    target = Model(seed=2)
    before = target.mlp.weight.detach().clone()

    with pytest.raises(ModelBankError) as raised:
        load(path, target, load=["tower.*"])
    assert str(raised.value).startswith("`bank[0].load` pattern 'tower.*' must match a parameter or table of ")
    load(path, target, load=["tower.*"], ignore_missing=True)
    assert torch.equal(target.mlp.weight, before)


def test_a_rename_onto_a_name_the_source_has_is_refused(source: tuple[Model, Path]) -> None:
    _, path = source

    with pytest.raises(ModelBankError, match=r"moves 'mlp.weight' onto 'mlp.bias'"):
        load(path, Model(seed=2), rename={"mlp.weight": "mlp.bias"})


def test_a_source_path_without_a_checkpoint_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelBankError) as raised:
        load(tmp_path, Model(seed=2))
    assert str(raised.value) == f"`bank[0]` must name a run or checkpoint, but {tmp_path} holds no checkpoint."


def test_reset_tables_naming_a_fixed_table_is_refused(source: tuple[Model, Path]) -> None:
    _, path = source

    with pytest.raises(ModelBankError, match=r"must name hash tables, but 'embeddings\.user' is a fixed table"):
        load(path, Model(seed=2), reset_tables=["embeddings.user"])


def test_a_periodic_reload_takes_the_source_s_newest_checkpoint(source: tuple[Model, Path]) -> None:
    model, path = source
    target = Model(seed=2)
    bank = ModelBank([("bank[0]", ModelBankSource(path=str(path)))], target, target.sharded, FakeGang(), 4)
    bank.load()
    with torch.no_grad():
        model.mlp.weight.add_(1.0)
    model.see([7])
    save(model, path, 9)

    bank.after_step(3, epoch_ended=False, data_epoch_nr=0)
    assert not torch.equal(target.mlp.weight, model.mlp.weight)  # Not due at step 3.
    bank.after_step(4, epoch_ended=False, data_epoch_nr=0)

    assert torch.equal(target.mlp.weight, model.mlp.weight)
    assert sorted(item_rows(target)) == [3, 4, 7]


def test_a_save_filter_leaves_out_parameters_tables_and_what_the_recipe_refuses() -> None:
    model = Model(seed=1)
    shared = {"model": model.state_dict(), "optimizer": {"state": {"mlp.bias": {"x": 1}}, "param_groups": []}}
    per_rank = {"sharded": {"embeddings": model.embeddings.sharded_state_dict()}, "rng": {}}
    save_filter = SaveFilter(["mlp.bias", "embeddings.item"], keep=lambda name: name != "rng")

    shared, per_rank, left_out = save_filter.apply(shared, per_rank)

    assert sorted(left_out) == ["embeddings.item", "mlp.bias", "rng"]
    assert sorted(shared["model"]) == ["mlp.weight"]
    assert shared["optimizer"] == {"state": {}, "param_groups": []}  # A resume starts its moments afresh.
    assert sorted(per_rank) == ["sharded"]
    assert sorted(per_rank["sharded"]["embeddings"]["tables"]) == ["user"]


def test_checkpoint_exclude_leaves_out_run_state_it_names_exactly_but_no_glob_does() -> None:
    shared = {"model": {"w": torch.zeros(1)}, "optimizer": {"dense": {"state": {"w": {}}}, "sparse": {}}}
    per_rank: dict[str, Any] = {"data_reader": {}, "rng": {}}

    _, kept_by_glob, by_glob = SaveFilter(["*"]).apply(shared, per_rank)
    named, _, by_name = SaveFilter(["optimizer"]).apply(shared, per_rank)

    assert (by_glob, sorted(kept_by_glob)) == (["w"], ["data_reader", "rng"])
    assert (by_name, sorted(named)) == (["optimizer"], ["model"])


def test_a_model_bank_reloads_after_every_n_windows_only(monkeypatch: pytest.MonkeyPatch) -> None:
    loads: list[int] = []
    bank = ModelBank([("checkpoint.model_bank[0]", ModelBankSource(path="elsewhere"))], nn.Linear(1, 1), {}, FakeGang(),
                     every_n_windows=2)  # fmt: skip
    monkeypatch.setattr(bank, "load", lambda: loads.append(1))

    assert bank.reloads
    for num_windows_done in range(1, 6):
        bank.after_window(num_windows_done)
        bank.after_step(num_windows_done, epoch_ended=True, data_epoch_nr=num_windows_done)  # no step or epoch period

    assert len(loads) == 2  # after windows 2 and 4
