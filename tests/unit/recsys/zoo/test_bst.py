"""BST: a transformer over the sequence and its candidate, against each row run alone (padding and its mask), every
parameter and table trained, and an order of behaviours learnt that DIN's attention, blind to order, cannot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from gang import FakeGang
from recipes import ConfigError
from recsys.zoo import ZOO_MODELS, ZooEmbeddingSection, build_zoo_model
from recsys.zoo.bst import BST
from support.sequence_data import (
    FEATURES,
    MAX_LEN,
    NUM_DENSE,
    SEQUENCE_LENGTHS,
    TABLES,
    OrderData,
    empty_batch,
    exported,
    padded_rows,
)
from support.zoo_data import optimizer, train_and_score


def build(name: str = "bst", backend: str = "sparse", dim: int = 16, **options: Any) -> nn.Module:
    config_class = ZOO_MODELS.get(name).config_class
    options = {"hidden_dims": [32], **({"num_heads": 2} if name == "bst" else {}), **options}
    config = config_class(name=name, embeddings=ZooEmbeddingSection(dim=dim, backend=backend), **options)
    return build_zoo_model(config, TABLES, FEATURES, NUM_DENSE, FakeGang(), 3, sequence_lengths=SEQUENCE_LENGTHS)


def test_a_padded_batch_scores_each_row_as_its_sequence_and_candidate_alone() -> None:
    model = build(backend="dense", dropout=0.0)
    assert isinstance(model, BST)
    model.eval()
    data = OrderData.make(6, seed=0)
    logits = model(data.batch(torch.arange(6)))

    tables = model.embeddings.bags  # type: ignore[union-attr]
    for row in range(6):
        history = tables["item"](data.history[data.offsets[row] : data.offsets[row + 1]])
        candidate = tables["item"](data.item[row : row + 1])
        length = len(history)
        positions = torch.cat([model.positions.weight[:length].flip(0), model.positions.weight[-1:]])
        hidden = model.blocks(torch.cat([history, candidate])[None] + positions)[0]
        user = tables["user"].weight[data.user[row]]
        parts = [data.dense[row], user, candidate[0], hidden[-1], hidden[:-1].mean(0)]
        torch.testing.assert_close(logits[row], model.mlp(torch.cat(parts)).squeeze(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", ["sparse", "dense"])
def test_bst_trains_every_parameter_and_table(backend: str) -> None:
    model = build(backend=backend)
    batch = OrderData.make(16, seed=0).batch(torch.arange(16))
    step = optimizer(model)

    nn.functional.binary_cross_entropy_with_logits(model(batch), batch.labels).backward()
    for name, param in model.named_parameters():
        assert param.grad is not None and bool(param.grad.ne(0).any()), f"no gradient for {name}"
    step.step()


def test_bst_scores_a_batch_of_zero_rows() -> None:
    model = build()
    empty = empty_batch(FEATURES, NUM_DENSE)
    for train in (True, False):
        model.train(train)
        assert model(empty).shape == (0,)


def test_bst_needs_heads_that_divide_the_dim() -> None:
    with pytest.raises(ConfigError, match=r"`model.num_heads` must divide the dim of the sequence's table \(16\)"):
        build(num_heads=3)


def test_bst_learns_which_item_came_last_which_din_cannot() -> None:
    train, test = OrderData.make(4096, seed=10), OrderData.make(1024, seed=11)

    bst_auc = train_and_score(build(dropout=0.0), train, test, steps=400, lr=0.01)
    din_auc = train_and_score(build("din", dropout=0.0), train, test, steps=400, lr=0.01)

    assert bst_auc > 0.9 and din_auc < 0.65, (bst_auc, din_auc)


def test_bst_serves_its_probability_from_the_vectors_and_the_padded_sequence(tmp_path: Path) -> None:
    model = build("bst", "dense", num_heads=2, dropout=0.0)
    assert isinstance(model, BST)
    model.eval()
    data = OrderData.make(6, seed=2)
    expected = torch.sigmoid(model(data.batch(torch.arange(6))))

    split = model.dense_for_serving()
    tables = model.embeddings.bags  # type: ignore[union-attr]
    padded, lengths = padded_rows(tables["item"].weight, data.history, data.offsets)
    pooled = [tables["user"].weight[data.user], tables["item"].weight[data.item]]
    assert [(i.table, i.feature, i.pooling) for i in split.inputs] == [("user", "user", "sum"), ("item", "item", "sum")]
    assert [(s.table, s.feature, s.max_len) for s in split.sequences] == [("item", "history", MAX_LEN)]
    program = exported(split, tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(program(data.dense, pooled, [padded], [lengths]), expected, rtol=1e-5, atol=1e-6)
