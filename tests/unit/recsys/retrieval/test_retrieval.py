"""Retrieval: the in-batch softmax against its formula, the corpus ranks against brute force, and the two models
(two-tower, SASRec) against plain torch and on an order-dependent pattern that a pooled history cannot learn."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.functional import cross_entropy

from embedding import JaggedIds, SparseFeatures
from gang import FakeGang
from recipes import ConfigError
from recsys.click.batch import CTRBatch
from recsys.models.embeddings import TableSpec
from recsys.retrieval import units as retrieval_units
from recsys.retrieval.model import RetrievalModel
from recsys.retrieval.units import ItemCorpus, RetrievalEvalUnit, RetrievalTrainUnit
from recsys.zoo import ZOO_MODELS, ZooEmbeddingSection, build_zoo_model
from recsys.zoo.retrieval_models import SASRec
from support.sequence_data import (
    MAX_LEN,
    NEXT_FEATURES,
    NEXT_TABLES,
    NUM_ITEMS,
    NextItemData,
    cluster_rows,
    empty_batch,
)
from support.zoo_data import optimizer
from units import MetricBag

CPU = torch.device("cpu")


def config(name: str, backend: str = "sparse", dim: int = 16, **options: Any) -> Any:
    config_class = ZOO_MODELS.get(name).config_class
    options.setdefault("item_feature", "item")
    return config_class(name=name, embeddings=ZooEmbeddingSection(dim=dim, backend=backend), **options)


def build(name: str, backend: str = "sparse", **options: Any) -> RetrievalModel:
    model = build_zoo_model(
        config(name, backend, **options),
        NEXT_TABLES,
        NEXT_FEATURES,
        0,
        FakeGang(),
        3,
        sequence_lengths={"history": MAX_LEN},
    )
    assert isinstance(model, RetrievalModel)
    return model


def corpus_of(data: NextItemData) -> ItemCorpus:
    counts = torch.bincount(data.item, minlength=NUM_ITEMS)[1:].to(torch.float64)
    return ItemCorpus(torch.arange(1, NUM_ITEMS), counts / counts.sum())


class FixedVectors(RetrievalModel):
    """Queries and items given, for the units' arithmetic alone."""

    def __init__(self, queries: torch.Tensor, items: torch.Tensor, corpus: torch.Tensor) -> None:
        super().__init__(nn.Identity(), ["item"], "item", 0.5)
        self.given, self.corpus = (queries, items), corpus
        self.weight = nn.Parameter(torch.ones(()))

    def forward(self, batch: CTRBatch) -> tuple[torch.Tensor, torch.Tensor]:
        return self.given[0] * self.weight, self.given[1]

    def items(self, ids: torch.Tensor) -> torch.Tensor:
        return self.corpus[ids]


def batch_of(item_ids: list[int], labels: list[float]) -> CTRBatch:
    ids = torch.tensor(item_ids)
    return CTRBatch(
        torch.zeros(len(ids), 0), SparseFeatures({"item": JaggedIds.from_dense(ids[:, None])}), torch.tensor(labels)
    )


# The units' arithmetic -----------------------------------------------------------------------


def test_the_loss_is_a_softmax_over_the_batchs_items_with_log_q_and_no_copy_of_the_own_item_as_negative() -> None:
    generator = torch.Generator().manual_seed(0)
    queries, items = torch.randn(4, 3, generator=generator), torch.randn(4, 3, generator=generator)
    corpus = ItemCorpus(torch.tensor([2, 5, 9]), torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64))
    unit = RetrievalTrainUnit(FixedVectors(queries, items, torch.zeros(10, 3)), MetricBag(FakeGang()), CPU, corpus)

    loss = unit(batch_of([2, 5, 2, 9], [1.0, 1.0, 1.0, 0.0]))

    logits = queries @ items.T / 0.5 - torch.log(torch.tensor([0.5, 0.3, 0.5, 0.2]))
    logits[0, 2] = logits[2, 0] = float("-inf")  # rows 0 and 2 hold item 2: neither is the other's negative
    expected = cross_entropy(logits, torch.arange(4), reduction="none") * torch.tensor([1.0, 1.0, 1.0, 0.0])
    torch.testing.assert_close(loss, expected.float())


def test_ranks_count_the_other_items_scored_higher_over_the_whole_corpus_whatever_the_chunks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    generator = torch.Generator().manual_seed(1)
    corpus_vectors = torch.randn(40, 4, generator=generator)
    queries, own = torch.randn(6, 4, generator=generator), torch.tensor([3, 7, 7, 39, 1, 20])
    corpus = ItemCorpus(torch.arange(1, 40), torch.full((39,), 1 / 39, dtype=torch.float64))
    model = FixedVectors(queries, corpus_vectors[own], corpus_vectors)
    scores = queries.double() @ corpus_vectors[1:].double().T
    brute = [int(sum(scores[r, i] > scores[r, own[r] - 1] for i in range(39) if i + 1 != own[r])) for r in range(6)]

    for chunk in (5, 8192):
        monkeypatch.setattr(retrieval_units, "CORPUS_CHUNK", chunk)
        bag = MetricBag(FakeGang())
        unit = RetrievalEvalUnit(model, bag, CPU, corpus, top_k=[3, 10])
        ranks = unit.predict(batch_of(own.tolist(), [1.0, 1.0, 1.0, 1.0, 1.0, 0.0]))["rank"]
        assert ranks.tolist() == brute
        metrics = bag.compute()
        ranked = torch.tensor(brute[:5], dtype=torch.float64)  # the positive rows
        assert metrics["hr@3"] == pytest.approx(float((ranked < 3).double().mean()))
        gains = torch.where(ranked < 10, 1 / torch.log2(ranked + 2), 0.0)
        assert metrics["ndcg@10"] == pytest.approx(float(gains.mean()))


# The models ----------------------------------------------------------------------------------


def test_sasrec_over_a_padded_batch_equals_each_sequence_run_alone() -> None:
    """Padding and the causal mask: a row's query is the last output of its own items, whatever the others'."""
    model = build("sasrec", "dense", dropout=0.0)
    assert isinstance(model, SASRec)
    model.eval()
    data = NextItemData.make(5, seed=0)
    queries, items = model(data.batch(torch.arange(5)))

    table = model.embeddings.bags["item"]  # type: ignore[union-attr,index]
    for row in range(5):
        history = data.history[data.offsets[row] : data.offsets[row + 1]]
        inputs = table(history) * 16**0.5 + model.positions.weight[: len(history)].flip(0)
        mask = torch.triu(torch.ones(len(history), len(history), dtype=torch.bool), diagonal=1)
        alone = model.norm(model.blocks(inputs[None], mask=mask, is_causal=True)[0, -1])
        torch.testing.assert_close(queries[row], alone, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(items[row], table(data.item[row]))


@pytest.mark.parametrize("backend", ["sparse", "dense"])
@pytest.mark.parametrize("name", ["sasrec", "two_tower"])
def test_a_retrieval_model_trains_every_parameter_and_table(name: str, backend: str) -> None:
    model = build(name, backend)
    data = NextItemData.make(32, seed=0)
    unit = RetrievalTrainUnit(model, MetricBag(FakeGang()), CPU, corpus_of(data))
    step = optimizer(model)

    unit(data.batch(torch.arange(32))).sum().backward()
    for param_name, param in model.named_parameters():
        assert param.grad is not None and bool(param.grad.ne(0).any()), f"{name}: no gradient for {param_name}"
    step.step()


@pytest.mark.parametrize("name", ["sasrec", "two_tower"])
def test_a_retrieval_model_ranks_a_batch_of_zero_rows(name: str) -> None:
    model = build(name)
    model.eval()
    empty = empty_batch(NEXT_FEATURES, 0)
    bag = MetricBag(FakeGang())
    unit = RetrievalEvalUnit(model, bag, CPU, corpus_of(NextItemData.make(8, seed=0)), top_k=[10])
    with torch.no_grad():
        assert unit.predict(empty)["rank"].shape == (0,)


def test_a_retrieval_model_names_its_item_and_sasrec_reads_its_sequence_alone() -> None:
    with pytest.raises(ConfigError, match=r"`model.item_feature` must name a single-valued categorical column"):
        build_zoo_model(
            config("two_tower", item_feature="history"),
            NEXT_TABLES,
            NEXT_FEATURES,
            0,
            FakeGang(),
            0,
            sequence_lengths={"history": MAX_LEN},
        )
    tables = [*NEXT_TABLES, TableSpec("user", 10, ("user",))]
    with pytest.raises(ConfigError, match=r"`sasrec` reads the sequence 'history' and scores the item 'item' alone"):
        build_zoo_model(
            config("sasrec"), tables, [*NEXT_FEATURES, "user"], 0, FakeGang(), 0, sequence_lengths={"history": MAX_LEN}
        )


# Learning ------------------------------------------------------------------------------------


def hit_rate(model: RetrievalModel, steps: int, make: Callable[[int, int], NextItemData] = NextItemData.make) -> float:
    """HR@10 over held-out rows after ``steps`` steps of in-batch softmax on 64 rows."""
    train, test = make(4096, 10), make(512, 11)
    corpus = corpus_of(train)
    unit, step = RetrievalTrainUnit(model, MetricBag(FakeGang()), CPU, corpus), optimizer(model, lr=0.01)
    generator = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(steps):
        unit(train.batch(torch.randint(0, len(train), (64,), generator=generator))).mean().backward()
        step.step()
        step.zero_grad()
    model.eval()
    bag = MetricBag(FakeGang())
    with torch.no_grad():
        RetrievalEvalUnit(model, bag, CPU, corpus, top_k=[10])(test.batch(torch.arange(len(test))))
    return bag.compute()["hr@10"]


def test_sasrec_retrieves_the_successor_of_the_last_item_which_a_pooled_history_cannot() -> None:
    sasrec, pooled = hit_rate(build("sasrec", dropout=0.0), 300), hit_rate(build("two_tower", dropout=0.0), 300)

    assert sasrec > 0.9 and pooled < 0.3, (sasrec, pooled)


def test_two_towers_retrieve_the_items_of_the_historys_cluster_where_the_most_popular_hit_one_in_ten() -> None:
    assert hit_rate(build("two_tower", dropout=0.0), 300, cluster_rows) > 0.8


# Serving -------------------------------------------------------------------------------------


def test_two_towers_serve_as_a_query_program_over_pooled_inputs_and_item_vectors_of_the_table_rows() -> None:
    model = build("two_tower", "dense", dropout=0.0)
    model.eval()
    data = NextItemData.make(5, seed=0)
    queries, items = model(data.batch(torch.arange(5)))
    serving = model.dense_for_serving()  # type: ignore[operator]
    table = model.embeddings.bags["item"]  # type: ignore[union-attr,index]

    pooled = [torch.stack([table(data.history[data.offsets[r] : data.offsets[r + 1]]).mean(0) for r in range(5)])]
    assert [(p.table, p.feature, p.pooling) for p in serving.inputs] == [("item", "history", "mean")]
    torch.testing.assert_close(serving.module(torch.zeros(5, 0), pooled), queries)
    assert serving.items is not None and (serving.items.table, serving.items.dim) == ("item", 64)
    torch.testing.assert_close(serving.items.tower(table(data.item)), items)
    assert serving.temperature == model.temperature


def test_sasrec_serves_as_a_query_program_over_the_padded_sequence_and_the_item_rows_as_vectors() -> None:
    model = build("sasrec", "dense", dropout=0.0)
    model.eval()
    data = NextItemData.make(5, seed=0)
    queries, items = model(data.batch(torch.arange(5)))
    serving = model.dense_for_serving()  # type: ignore[operator]
    table = model.embeddings.bags["item"]  # type: ignore[union-attr,index]

    lengths = torch.diff(data.offsets)
    padded = torch.randn(5, MAX_LEN, 16)  # What follows a row's length is never read.
    for row in range(5):
        padded[row, : lengths[row]] = table(data.history[data.offsets[row] : data.offsets[row + 1]])
    assert serving.inputs == () and [(s.table, s.feature, s.max_len) for s in serving.sequences] == [
        ("item", "history", MAX_LEN)
    ]
    torch.testing.assert_close(serving.module(torch.zeros(5, 0), [], [padded], [lengths]), queries)
    assert serving.items is not None and (serving.items.table, serving.items.dim) == ("item", 16)
    torch.testing.assert_close(serving.items.tower(table(data.item)), items)
    assert serving.temperature == model.temperature
