"""The zoo's models of behaviour sequences, several tasks and retrieval, each split over a real TP gang of 2 (gloo)
by its own ``tensor_parallel_plan()`` as the trainer splits it (then FSDP2 over the DP gang): on the same batch and
from the same initial weights, it gives the outputs of the model whole, and after one SGD step the same loss and
the same parameters, gathered back to full tensors as a checkpoint gathers them (the tables among them: dense
ones, which the SGD step updates by their gradients as it does the layers'). A width the gang does not divide is
one line at start-up, and a model with nothing to split runs whole.

One job of two processes checks every model, as each process start costs seconds of the suite's time."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest
import torch
from torch import nn

from gang import FakeGang, Gang
from recipes import ConfigError
from recipes.training.parallel import data_parallel, model_state, tensor_parallel
from recsys.click.batch import CTRBatch
from recsys.click.tasks import Task
from recsys.click.units import CTRTrainUnit
from recsys.retrieval.model import RetrievalModel
from recsys.retrieval.units import ItemCorpus, RetrievalTrainUnit
from recsys.zoo import ZOO_MODELS, ZooEmbeddingSection, build_zoo_model
from support import sequence_data, zoo_data
from support.gloo_jobs import free_port, gloo_gangs, start_ranks
from units import MetricBag, TrainUnit

CPU = torch.device("cpu")
ROWS, SEED = 16, 5
TASKS = (Task("click"), Task("ctcvr"))
"""The multi-task models' tasks (ESMM's names; MMoE and PLE take any)."""
Data = Literal["sequences", "next_items", "tasks"]


@dataclass(frozen=True)
class Case:
    """A zoo model of small options (no dropout, whose draws differ between a split layer and a whole one), on the
    data its kind reads, with the number of layers its plan splits."""

    name: str
    data: Data
    split_layers: int
    options: dict[str, Any] = field(default_factory=dict)

    def build(self, dp: Gang) -> nn.Module:
        config_class = ZOO_MODELS.get(self.name).config_class
        section = ZooEmbeddingSection(dim=8, backend="dense")
        config = config_class(name=self.name, embeddings=section, dropout=0.0, **self.options)
        if self.data == "tasks":
            tables, features, dense = zoo_data.TABLES, zoo_data.FEATURES, zoo_data.NUM_DENSE
            return build_zoo_model(config, tables, features, dense, dp, SEED, num_tasks=len(TASKS), tasks=TASKS)
        if self.data == "next_items":
            tables, features, dense = sequence_data.NEXT_TABLES, sequence_data.NEXT_FEATURES, 0
        else:
            tables, features, dense = sequence_data.TABLES, sequence_data.FEATURES, sequence_data.NUM_DENSE
        return build_zoo_model(
            config, tables, features, dense, dp, SEED, sequence_lengths=sequence_data.SEQUENCE_LENGTHS
        )

    def batch(self) -> CTRBatch:
        rows = torch.arange(ROWS)
        if self.data == "next_items":
            return sequence_data.NextItemData.make(ROWS, seed=1).batch(rows)
        if self.data == "sequences":
            return sequence_data.MembershipData.make(ROWS, seed=1).batch(rows)
        data = zoo_data.XorData.make(ROWS, seed=1)
        batch = data.batch(rows)
        labels = torch.stack([data.labels, data.labels * (data.a % 2).float()], dim=1)  # A click, and click AND odd a.
        return CTRBatch(batch.dense, batch.sparse, labels)

    def train_unit(self, model: nn.Module) -> TrainUnit[CTRBatch]:
        """The recipe's train unit: the loss of each row."""
        if self.data == "next_items":
            items = torch.arange(1, sequence_data.NUM_ITEMS)
            corpus = ItemCorpus(items, torch.full((len(items),), 1 / len(items), dtype=torch.float64))
            return RetrievalTrainUnit(model, MetricBag(FakeGang()), CPU, corpus)
        return CTRTrainUnit(model, MetricBag(FakeGang()), CPU, TASKS if self.data == "tasks" else None)


CASES = {
    "din": Case("din", "sequences", 2, {"hidden_dims": [16, 8], "attention_dims": [8]}),
    "bst": Case("bst", "sequences", 2, {"hidden_dims": [16, 8], "num_heads": 2}),
    "sasrec": Case("sasrec", "next_items", 4, {"num_heads": 2, "item_feature": "item"}),
    "two_tower": Case("two_tower", "next_items", 4, {"hidden_dims": [16], "out_dim": 8, "item_feature": "item"}),
    "mmoe": Case("mmoe", "tasks", 8, {"num_experts": 2, "expert_dims": [16, 8], "tower_dims": [8, 4]}),
    "ple": Case("ple", "tasks", 28, {"expert_dims": [16, 8], "tower_dims": [8, 4]}),
    "esmm": Case("esmm", "tasks", 4, {"tower_dims": [16, 8]}),
    "nothing to split": Case("din", "sequences", 0, {"hidden_dims": [16], "attention_dims": [8]}),
}
UNEVEN = Case("din", "sequences", 4, {"hidden_dims": [6, 4, 5, 4], "attention_dims": [8]})
"""Its plan splits the widths 6 and 5 (and keeps the output layer whole)."""


def step(case: Case, model: nn.Module) -> dict[str, Any]:
    """``model``'s outputs on the case's batch in eval mode (a retrieval model's item vectors too), then its loss,
    and its state after one SGD step."""
    batch = case.batch()
    # Made before any forward, as the trainer makes it: FSDP2 leaves a model's parameters gathered after a forward
    # that no backward follows, and an optimizer made then would step those copies.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model.eval()
    with torch.no_grad():
        outputs = model(batch)
        if isinstance(model, RetrievalModel):  # and the item tower over the corpus, as validation ranks it
            outputs = (*outputs, model.items(torch.arange(1, sequence_data.NUM_ITEMS)))
    model.train()
    loss = case.train_unit(model)(batch).mean()
    loss.backward()
    optimizer.step()
    return {"outputs": outputs, "loss": loss.detach(), "state": model_state(model)}


def split_and_train_every_case(rank: int, world_size: int, port: int, out_dir: str) -> None:
    with gloo_gangs(rank, world_size, port, tp_size=2) as gangs:
        results: dict[str, Any] = {}
        for label, case in CASES.items():
            whole, split = case.build(gangs.dp), case.build(gangs.dp)
            plan = split.tensor_parallel_plan()  # type: ignore[operator]
            linears = {name for name, module in split.named_modules() if isinstance(module, nn.Linear)}
            tensor_parallel(split, gangs)
            results[label] = {
                "planned": len(plan),
                "not_linear": sorted(set(plan) - linears),
                "parameters": sorted(name for name, _ in whole.named_parameters()),
                "whole": step(case, whole),
                "split": step(case, data_parallel(split, gangs)),
            }
        results["uneven"] = None
        try:
            tensor_parallel(UNEVEN.build(gangs.dp), gangs)
        except ConfigError as error:
            results["uneven"] = str(error)
        torch.save(results, Path(out_dir, f"rank_{rank}.pt"))


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Each rank's results: one job for every case."""
    out_dir = tmp_path_factory.mktemp("tensor_parallel")
    start_ranks(split_and_train_every_case, (2, free_port(), str(out_dir)), world_size=2)
    return [torch.load(out_dir / f"rank_{rank}.pt", weights_only=False) for rank in range(2)]


@pytest.mark.parametrize("label", CASES)
def test_a_model_split_by_its_plan_computes_and_trains_as_the_model_whole(
    results: list[dict[str, Any]], label: str
) -> None:
    by_rank = [by_label[label] for by_label in results]
    assert [(result["planned"], result["not_linear"]) for result in by_rank] == [(CASES[label].split_layers, [])] * 2
    for key in ("outputs", "loss"):  # The failing item's index is the rank's.
        torch.testing.assert_close([r["split"][key] for r in by_rank], [r["whole"][key] for r in by_rank])
    whole, split = by_rank[0]["whole"]["state"], by_rank[0]["split"]["state"]  # gathered on rank 0
    assert set(by_rank[0]["parameters"]) <= set(whole) and set(split) == set(whole)
    torch.testing.assert_close(split, whole)


def test_a_width_the_gang_does_not_divide_is_one_line_at_start_up(results: list[dict[str, Any]]) -> None:
    message = "`model.hidden_dims[2]` must be divisible by gang.tp_size (2), but is 5 instead."

    assert [by_label["uneven"] for by_label in results] == [message, message]
