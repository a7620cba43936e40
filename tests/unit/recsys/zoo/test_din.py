"""DIN and the padding of jagged sequences: against plain torch over padded tensors, every parameter and table
trained, and a target dependence learnt that a pooled history of the same tables cannot learn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from embedding import JaggedIds, SparseFeatures
from gang import FakeGang
from recipes.training.sparse_tables import find_sparse_tables
from recsys.click.batch import CTRBatch
from recsys.click.tasks import Task
from recsys.models.embeddings import TableSpec
from recsys.models.sequences import SequenceLayout, masked_mean
from recsys.zoo import ZOO_MODELS, ZooEmbeddingSection, build_zoo_model
from recsys.zoo.din import DIN
from support.sequence_data import (
    FEATURES,
    MAX_LEN,
    NUM_DENSE,
    SEQUENCE_LENGTHS,
    TABLES,
    MembershipData,
    empty_batch,
    exported,
    padded_rows,
)
from support.zoo_data import optimizer, train_and_score


def din_config(backend: str = "sparse", dim: int = 8, **options: Any) -> Any:
    config_class = ZOO_MODELS.get("din").config_class
    return config_class(
        name="din", embeddings=ZooEmbeddingSection(dim=dim, backend=backend), **{"hidden_dims": [16], **options}
    )


def build(backend: str = "sparse", **options: Any) -> nn.Module:
    return build_zoo_model(
        din_config(backend, **options), TABLES, FEATURES, NUM_DENSE, FakeGang(), 3, sequence_lengths=SEQUENCE_LENGTHS
    )


# Padding -------------------------------------------------------------------------------------


def test_a_layout_pads_each_row_from_its_first_position_and_masks_the_rest() -> None:
    offsets = torch.tensor([0, 2, 2, 5])
    vectors = torch.arange(10, dtype=torch.float32).reshape(5, 2).requires_grad_()
    layout = SequenceLayout.of(offsets, 5, max_len=4)

    padded = layout.pad(vectors)

    assert layout.mask.tolist() == [[True, True, False, False], [False] * 4, [True, True, True, False]]
    assert padded.tolist() == [
        [[0, 1], [2, 3], [0, 0], [0, 0]],
        [[0, 0]] * 4,
        [[4, 5], [6, 7], [8, 9], [0, 0]],
    ]
    assert masked_mean(padded, layout.mask).tolist() == [[1, 2], [0, 0], [6, 7]]
    padded.sum().backward()
    assert vectors.grad is not None and vectors.grad.eq(1).all()


def test_a_layout_takes_the_softmax_and_the_sums_of_each_rows_jagged_values() -> None:
    layout = SequenceLayout.of(torch.tensor([0, 2, 2, 5]), 5, max_len=4)
    scores = torch.tensor([0.0, 1.0, 2.0, 2.0, -1.0])
    vectors = torch.arange(10, dtype=torch.float32).reshape(5, 2)

    weights = layout.softmax(scores)

    torch.testing.assert_close(weights[:2], torch.softmax(scores[:2], 0))
    torch.testing.assert_close(weights[2:], torch.softmax(scores[2:], 0))
    assert layout.row_sums(vectors).tolist() == [[2, 4], [0, 0], [18, 21]]


# The model -----------------------------------------------------------------------------------


def test_the_default_config_builds_with_dropout_in_its_deep_mlp() -> None:
    config = ZOO_MODELS.get("din").default_config()
    model = build_zoo_model(config, TABLES, FEATURES, NUM_DENSE, FakeGang(), 0, sequence_lengths=SEQUENCE_LENGTHS)

    assert model(MembershipData.make(5, seed=0).batch(torch.arange(5))).shape == (5,)
    assert any(isinstance(module, nn.Dropout) and module.p == 0.2 for module in model.modules())


def test_din_is_target_attention_then_an_mlp_as_plain_torch_over_padded_tensors() -> None:
    """The paper's model written out with ``nn.Embedding`` lookups and a Python loop over each row's sequence."""
    model = build("dense", attention_dims=[6, 5], dropout=0.0)
    assert isinstance(model, DIN)
    model.eval()
    data = MembershipData.make(7, seed=1)
    batch = data.batch(torch.arange(7))
    tables = model.embeddings.bags  # type: ignore[union-attr]

    expected = []
    for row in range(7):
        user = tables["user"].weight[data.user[row]]
        item = tables["item"].weight[data.item[row]]
        history = tables["item"].weight[data.history[data.offsets[row] : data.offsets[row + 1]]]
        unit = model.attention["history"].mlp
        scores = torch.stack([unit(torch.cat([h, item, h - item, h * item])).squeeze() for h in history])
        weights = torch.softmax(scores / history.shape[1] ** 0.5, dim=0)
        interest = (weights[:, None] * history).sum(0)
        expected.append(model.mlp(torch.cat([data.dense[row], user, item, interest])).squeeze())

    torch.testing.assert_close(model(batch), torch.stack(expected), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["sparse", "dense"])
def test_din_scores_each_sample_and_trains_every_parameter_and_table(backend: str) -> None:
    model = build(backend, dropout=0.0)  # Dropout's masks would come from the generator other tests left.
    batch = MembershipData.make(16, seed=0).batch(torch.arange(16))
    step = optimizer(model)
    shards = {name: shard for c in find_sparse_tables(model).values() for name, shard in c.shards.items()}
    before = {name: shard.weight.clone() for name, shard in shards.items()}

    logits = model(batch)
    nn.functional.binary_cross_entropy_with_logits(logits, batch.labels).backward()
    step.step()

    assert logits.shape == (16,)
    for name, param in model.named_parameters():
        assert param.grad is not None and bool(param.grad.ne(0).any()), f"no gradient for {name}"
    assert set(before) == ({"user", "item"} if backend == "sparse" else set())
    assert all(not torch.equal(before[name], shards[name].weight) for name in before)


def test_din_gives_an_output_per_task_from_its_last_layer() -> None:
    model = build_zoo_model(
        din_config(), TABLES, FEATURES, NUM_DENSE, FakeGang(), 0, num_tasks=3, sequence_lengths=SEQUENCE_LENGTHS
    )

    assert model(MembershipData.make(5, seed=0).batch(torch.arange(5))).shape == (5, 3)


def test_din_scores_a_batch_of_zero_rows() -> None:
    model = build()
    empty = empty_batch(FEATURES, NUM_DENSE)
    for train in (True, False):
        model.train(train)
        assert model(empty).shape == (0,)


def test_a_row_of_no_item_attends_to_nothing_and_leaves_every_gradient_finite() -> None:
    model = build(dropout=0.0)
    batch = MembershipData.make(4, seed=0).batch(torch.arange(4))
    history = batch.sparse["history"]
    first = int(history.offsets[1])  # Row 0's items dropped: its sequence is empty.
    sparse = SparseFeatures(
        {**batch.sparse, "history": JaggedIds(history.ids[first:], history.offsets.clamp_min(first) - first)}
    )
    logits = model(CTRBatch(batch.dense, sparse, batch.labels))
    logits.sum().backward()

    assert bool(logits.isfinite().all())
    assert all(bool(param.grad.isfinite().all()) for param in model.parameters() if param.grad is not None)


def test_a_sequence_without_a_candidate_in_its_table_is_pooled_by_its_mean() -> None:
    tables = [
        TableSpec("user", 50, ("user",)),
        TableSpec("item", 400, ("item",)),
        TableSpec("seen", 400, ("history",), "none"),
    ]
    model = build_zoo_model(din_config(), tables, FEATURES, NUM_DENSE, FakeGang(), 0, sequence_lengths=SEQUENCE_LENGTHS)

    assert isinstance(model, DIN) and not model.attention
    assert model(MembershipData.make(4, seed=0).batch(torch.arange(4))).shape == (4,)


# Learning ------------------------------------------------------------------------------------


def test_din_learns_whether_the_candidate_is_in_the_sequence_which_a_pooled_history_cannot() -> None:
    """The same tables (one of items, for the candidate and the sequence) and MLP, the same steps: attention
    compares the candidate with each item; a mean of the history dilutes the one item that matches."""
    pooled_tables = [TABLES[0], TableSpec("item", TABLES[1].num_rows, ("item", "history"), "mean")]
    section = ZOO_MODELS.get("mlp").config_class(
        name="mlp", embeddings=ZooEmbeddingSection(dim=16), hidden_dims=[16], dropout=0.0
    )
    pooled = build_zoo_model(section, pooled_tables, FEATURES, NUM_DENSE, FakeGang(), 3)

    train, test = MembershipData.make(4096, seed=10), MembershipData.make(1024, seed=11)

    din_auc = train_and_score(build(dim=16, dropout=0.0), train, test, steps=400, lr=0.03)
    pooled_auc = train_and_score(pooled, train, test, steps=400, lr=0.03)

    assert din_auc > 0.9 and pooled_auc < 0.7, (din_auc, pooled_auc)


# Serving -------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_tasks", [1, 2])
def test_din_serves_its_scores_from_the_vectors_and_the_padded_sequence(tmp_path: Path, num_tasks: int) -> None:
    """The exported program over the looked-up rows (the history padded, its lengths beside) scores as ``predict``
    does: a probability a binary task, a regression task's prediction as it is."""
    model = build_zoo_model(
        din_config("dense", attention_dims=[6, 5], dropout=0.0),
        TABLES,
        FEATURES,
        NUM_DENSE,
        FakeGang(),
        3,
        num_tasks=num_tasks,
        sequence_lengths=SEQUENCE_LENGTHS,
    )
    assert isinstance(model, DIN)
    model.tasks = (Task("liked"), Task("rating", "regression"))[:num_tasks]
    model.eval()
    data = MembershipData.make(6, seed=2)
    logits = model(data.batch(torch.arange(6)))
    expected = torch.sigmoid(logits) if num_tasks == 1 else torch.stack([torch.sigmoid(logits[:, 0]), logits[:, 1]], 1)

    split = model.dense_for_serving()
    tables = model.embeddings.bags  # type: ignore[union-attr]
    padded, lengths = padded_rows(tables["item"].weight, data.history, data.offsets)
    pooled = [tables["user"].weight[data.user], tables["item"].weight[data.item]]
    assert [(i.table, i.feature, i.pooling) for i in split.inputs] == [("user", "user", "sum"), ("item", "item", "sum")]
    assert [(s.table, s.feature, s.max_len) for s in split.sequences] == [("item", "history", MAX_LEN)]
    assert split.outputs == (("liked", "rating") if num_tasks == 2 else ())
    program = exported(split, tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(program(data.dense, pooled, [padded], [lengths]), expected, rtol=1e-5, atol=1e-6)
        empty = program(data.dense, pooled, [padded], [torch.zeros_like(lengths)])  # Rows of no item: no attention.
    assert bool(empty.isfinite().all())
