"""The zoo's multi-task models, MMoE, PLE and ESMM: an output per task, every parameter and table trained, their math
as plain torch over their own parameters, their refusals in one line, and a task relation each learns that the
model it improves on cannot (a shared bottom for MMoE and PLE, a CVR model of the clicked rows for ESMM)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from embedding import JaggedIds, SparseFeatures
from gang import FakeGang
from recipes import ConfigError
from recipes.training.sparse_tables import find_sparse_tables
from recsys.click.batch import CTRBatch
from recsys.click.models import PooledModel
from recsys.click.tasks import Task
from recsys.click.units import task_losses
from recsys.zoo import ZOO_MODELS, ZooEmbeddingSection, build_zoo_model
from recsys.zoo.esmm import ESMM, ctcvr_logit
from recsys.zoo.multitask import MMoE
from recsys.zoo.ple import PLE
from support.zoo_data import FEATURES, NUM_DENSE, TABLES, Backend, XorData, optimizer
from units import BinaryAUC

MODELS = ["mmoe", "ple", "esmm"]
CLICKS = (Task("click"), Task("ctcvr"))
"""ESMM's tasks; the others take any two."""


def config(name: str, backend: Backend = "sparse", dim: int = 4, **options: Any) -> Any:
    config_class = ZOO_MODELS.get(name).config_class
    return config_class(name=name, embeddings=ZooEmbeddingSection(dim=dim, backend=backend), **options)


def small(name: str, backend: Backend = "sparse", **options: Any) -> Any:
    """Model ``name``'s config, small, without dropout (whose draws no seed of the model's fixes)."""
    sizes = {"tower_dims": [8], "expert_dims": [16, 8]} if name != "esmm" else {"tower_dims": [8, 4]}
    return config(name, backend, **{**sizes, "dropout": 0.0, **options})


def build(model_config: Any, tasks: tuple[Task, ...] = CLICKS, seed: int = 3) -> nn.Module:
    return build_zoo_model(
        model_config, TABLES, FEATURES, NUM_DENSE, FakeGang(), seed, num_tasks=len(tasks), tasks=tasks
    )


def labelled(data: XorData, rows: torch.Tensor, labels: torch.Tensor) -> CTRBatch:
    batch = data.batch(rows)
    return CTRBatch(batch.dense, batch.sparse, labels[rows])


def empty_batch(num_tasks: int) -> CTRBatch:
    sparse = {feature: JaggedIds.from_dense(torch.zeros(0, 1, dtype=torch.int64)) for feature in FEATURES}
    return CTRBatch(torch.zeros(0, NUM_DENSE), SparseFeatures(sparse), torch.zeros(0, num_tasks))


def auc(logits: torch.Tensor, labels: torch.Tensor) -> float:
    metric = BinaryAUC()
    metric.update(torch.sigmoid(logits), labels.long())
    return float(metric.compute())


def fit(model: nn.Module, rows: Any, steps: int, tasks: tuple[Task, ...], lr: float = 0.01) -> nn.Module:
    """``model`` after ``steps`` Adam steps of 64 rows drawn (seeded) from ``rows(indices)``: its batch."""
    step = optimizer(model, lr=lr)
    generator = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(steps):
        batch = rows(torch.randint(0, rows.size, (64,), generator=generator))
        task_losses(model(batch), batch.labels, tasks).mean().backward()
        step.step()
        step.zero_grad()
    return model.eval()


class Rows:
    """Rows ``indices`` of ``data`` (all by default) with ``labels`` ``[N, T]``, drawn by position."""

    def __init__(self, data: XorData, labels: torch.Tensor, indices: torch.Tensor | None = None) -> None:
        self.data, self.labels = data, labels
        self.indices = torch.arange(len(data)) if indices is None else indices
        self.size = len(self.indices)

    def __call__(self, positions: torch.Tensor) -> CTRBatch:
        return labelled(self.data, self.indices[positions], self.labels)


# Building and training -----------------------------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_the_default_config_builds_an_output_per_task_with_dropout(name: str) -> None:
    model = build(ZOO_MODELS.get(name).default_config())

    assert model(XorData.make(5, seed=0).batch(torch.arange(5))).shape == (5, 2)
    assert any(isinstance(module, nn.Dropout) and module.p == 0.2 for module in model.modules())


@pytest.mark.parametrize("name", ["mmoe", "ple"])
def test_the_experts_models_give_an_output_per_task_for_any_number_of_tasks(name: str) -> None:
    tasks = (Task("a"), Task("b", "regression"), Task("c"))

    assert build(small(name), tasks)(XorData.make(6, seed=0).batch(torch.arange(6))).shape == (6, 3)


@pytest.mark.parametrize("backend", ["sparse", "dense"])
@pytest.mark.parametrize("name", MODELS)
def test_every_multi_task_model_trains_every_parameter_and_table(name: str, backend: Backend) -> None:
    model = build(small(name, backend))
    data = XorData.make(32, seed=0)
    labels = torch.stack([data.labels, data.labels * (data.a % 2).float()], dim=1)  # A click, and click AND an odd a.
    batch = labelled(data, torch.arange(32), labels)
    step = optimizer(model)
    shards = {name: shard for c in find_sparse_tables(model).values() for name, shard in c.shards.items()}
    before = {name: shard.weight.clone() for name, shard in shards.items()}

    logits = model(batch)
    task_losses(logits, batch.labels, CLICKS).sum().backward()
    step.step()

    assert logits.shape == (32, 2) and logits.dtype == torch.float32
    for param_name, param in model.named_parameters():
        assert param.grad is not None and bool(param.grad.ne(0).any()), f"{name}: no gradient for {param_name}"
    assert set(before) == ({"a", "b", "tags"} if backend == "sparse" else set())
    assert all(not torch.equal(before[table], shards[table].weight) for table in before)


@pytest.mark.parametrize("name", MODELS)
def test_every_multi_task_model_scores_a_batch_of_zero_rows(name: str) -> None:
    model = build(small(name))
    for train in (True, False):
        model.train(train)
        assert model(empty_batch(2)).shape == (0, 2)


@pytest.mark.parametrize("name", MODELS)
def test_the_tensor_parallel_plan_splits_pairs_of_linear_layers_column_then_row(name: str) -> None:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    model = build(ZOO_MODELS.get(name).default_config())
    plan = model.tensor_parallel_plan()  # type: ignore[operator]
    modules = dict(model.named_modules())

    assert plan and all(isinstance(modules[path], nn.Linear) for path in plan)
    styles = list(plan.values())
    assert all(isinstance(style, (ColwiseParallel, RowwiseParallel)[i % 2]) for i, style in enumerate(styles))
    assert len(styles) % 2 == 0
    pairs = list(plan)
    for column, row in zip(pairs[0::2], pairs[1::2]):
        assert modules[column].out_features == modules[row].in_features  # type: ignore[union-attr]


@pytest.mark.parametrize("name", MODELS)
def test_the_exported_dense_part_scores_each_task_as_the_model(name: str) -> None:
    """``export``'s program: each binary task's probability (ESMM's pCTR and pCTCVR), a regression's number."""
    tasks = CLICKS if name == "esmm" else (Task("liked"), Task("rating", "regression"))
    model = build(small(name), tasks).eval()
    assert isinstance(model, PooledModel)
    model.tasks = tasks
    batch = XorData.make(16, seed=2).batch(torch.arange(16))
    with torch.no_grad():
        logits = model(batch)
        expected = (
            torch.sigmoid(logits) if name == "esmm" else torch.stack([torch.sigmoid(logits[:, 0]), logits[:, 1]], 1)
        )
        split = model.dense_for_serving()
        pooled_by_role = {role: module(batch.sparse) for role, (module, _) in model.lookups().items()}
        pooled = [
            pooled_by_role[role][feature] for role, (_, features) in model.lookups().items() for feature in features
        ]
        program = torch.export.export(split.module, (batch.dense, pooled), strict=False).module()

        assert split.outputs == tuple(task.name for task in tasks)
        torch.testing.assert_close(program(batch.dense, pooled), expected, rtol=1e-6, atol=1e-6)


# Refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_a_multi_task_model_refuses_one_task_in_one_line(name: str) -> None:
    with pytest.raises(ConfigError) as error:
        build(small(name), (Task("click"),))

    assert str(error.value) == (
        f"The model '{name}' learns several tasks at once, so the data must have at least 2 tasks "
        "(`dataset.labels`), but have 1 instead."
    )


@pytest.mark.parametrize(
    "tasks",
    [(Task("click"), Task("conversion")), (Task("click"), Task("ctcvr", "regression")), (*CLICKS, Task("other"))],
)
def test_esmm_refuses_tasks_other_than_the_click_and_the_click_and_conversion_in_one_line(
    tasks: tuple[Task, ...],
) -> None:
    with pytest.raises(ConfigError) as error:
        build(small("esmm"), tasks)

    shown = ", ".join(f"'{task.name}' ({task.kind})" for task in tasks)
    assert str(error.value) == (
        "The model 'esmm' fits pCTR and pCTCVR over every impression, so `dataset.labels` must be two binary tasks, "
        "the click 'click' and the click-and-conversion 'ctcvr' (`model.click_task`, `model.ctcvr_task`), but is "
        f"{shown} instead."
    )
    assert "\n" not in str(error.value)


def test_esmm_takes_its_tasks_by_name_in_either_order() -> None:
    model = build(small("esmm", click_task="clicked", ctcvr_task="bought"), (Task("bought"), Task("clicked")))
    assert isinstance(model, ESMM)
    model.eval()
    batch = XorData.make(6, seed=0).batch(torch.arange(6))
    pooled = {role: module(batch.sparse) for role, (module, _) in model.lookups().items()}
    ctr, cvr = model.towers([model.concatenated(batch.dense, pooled)] * 2).unbind(dim=1)

    logits = model(batch)

    torch.testing.assert_close(logits[:, 1], ctr)
    torch.testing.assert_close(torch.sigmoid(logits[:, 0]), torch.sigmoid(ctr) * torch.sigmoid(cvr))


# Against plain torch --------------------------------------------------------------------------


def inputs_of(model: Any, data: XorData, row: int) -> torch.Tensor:
    """Row ``row``'s input as plain torch: the dense features, then each feature's vector (the tags' mean)."""
    bags = model.embeddings.bags
    tags = data.tag_ids[data.tag_offsets[row] : data.tag_offsets[row + 1]]
    tag_vector = bags["tags"].weight[tags].mean(0) if len(tags) else torch.zeros(bags["tags"].weight.shape[1])
    return torch.cat([data.dense[row], bags["a"].weight[data.a[row]], bags["b"].weight[data.b[row]], tag_vector])


def expert(layers: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """An expert as its linear layers, each followed by a ReLU."""
    for layer in layers:
        if isinstance(layer, nn.Linear):
            x = torch.relu(x @ layer.weight.T + layer.bias)
    return x


def tower(layers: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """A tower as its linear layers, a ReLU between them, one output."""
    linears = [layer for layer in layers if isinstance(layer, nn.Linear)]
    for layer in linears[:-1]:
        x = torch.relu(x @ layer.weight.T + layer.bias)
    return (x @ linears[-1].weight.T + linears[-1].bias).squeeze()


def mixture(gate: nn.Module, x: torch.Tensor, experts: list[torch.Tensor]) -> torch.Tensor:
    weights = torch.softmax(tower(gate.mlp, x).reshape(-1), dim=0)  # type: ignore[arg-type]
    return sum((w * e for w, e in zip(weights, experts)), torch.zeros_like(experts[0]))


def assert_is_plain_torch(model: nn.Module, of_input: Callable[[torch.Tensor], torch.Tensor], seed: int) -> None:
    """``model``'s outputs on 6 rows equal ``of_input`` of each row's input (for ESMM, their probabilities)."""
    model.eval()
    data = XorData.make(6, seed=seed)
    expected = torch.stack([of_input(inputs_of(model, data, row)) for row in range(6)])
    outputs = model(data.batch(torch.arange(6)))
    outputs = torch.sigmoid(outputs) if isinstance(model, ESMM) else outputs
    torch.testing.assert_close(outputs, expected, rtol=1e-5, atol=1e-6)


def test_mmoe_is_experts_a_softmax_gate_per_task_and_towers_as_plain_torch() -> None:
    model = build(small("mmoe", "dense", num_experts=3, gate_dims=[5]), (Task("x"), Task("y"), Task("z")))
    assert isinstance(model, MMoE)

    def of_input(x: torch.Tensor) -> torch.Tensor:
        experts = [expert(e, x) for e in model.experts]  # type: ignore[arg-type]
        towers = zip(model.gates, model.towers.towers, strict=True)
        return torch.stack([tower(t, mixture(g, x, experts)) for g, t in towers])  # type: ignore[arg-type]

    assert_is_plain_torch(model, of_input, seed=1)


def test_ple_is_levels_of_task_and_shared_experts_then_towers_as_plain_torch() -> None:
    model = build(small("ple", "dense", num_levels=3, num_task_experts=2, num_shared_experts=1), (Task("x"), Task("y")))
    assert isinstance(model, PLE)
    levels: list[Any] = list(model.levels)
    assert levels[-1].shared_gate is None and all(level.shared_gate is not None for level in levels[:-1])

    def of_input(x: torch.Tensor) -> torch.Tensor:
        task_inputs, shared_input = [x, x], x
        for level in levels:
            shared = [expert(e, shared_input) for e in level.shared_experts]
            own = [[expert(e, xt) for e in group] for group, xt in zip(level.task_experts, task_inputs)]
            mixed = [mixture(g, xt, [*o, *shared]) for g, xt, o in zip(level.task_gates, task_inputs, own)]
            if level.shared_gate is not None:
                shared_input = mixture(level.shared_gate, shared_input, [*own[0], *own[1], *shared])
            task_inputs = mixed
        return torch.stack([tower(t, xt) for t, xt in zip(model.towers.towers, task_inputs)])  # type: ignore[arg-type]

    assert_is_plain_torch(model, of_input, seed=2)


def test_esmm_is_pctr_and_pctr_times_pcvr_as_plain_torch() -> None:
    model = build(small("esmm", "dense"))
    assert isinstance(model, ESMM)

    def of_input(x: torch.Tensor) -> torch.Tensor:
        ctr, cvr = (torch.sigmoid(tower(t, x)) for t in model.towers.towers)  # type: ignore[arg-type]
        return torch.stack([ctr, ctr * cvr])

    assert_is_plain_torch(model, of_input, seed=3)


def test_the_ctcvr_logit_is_the_logit_of_the_product_even_where_the_probabilities_round() -> None:
    ctr = torch.tensor([-3.0, 0.0, 2.0, 40.0, -40.0, 40.0], dtype=torch.float64)
    cvr = torch.tensor([1.0, 0.5, -2.0, 40.0, 3.0, -40.0], dtype=torch.float64)
    product = torch.sigmoid(ctr) * torch.sigmoid(cvr)

    torch.testing.assert_close(torch.sigmoid(ctcvr_logit(ctr, cvr)), product)
    assert torch.isfinite(ctcvr_logit(ctr.float(), cvr.float())).all()
    assert float(ctcvr_logit(torch.tensor(40.0), torch.tensor(40.0))) > 39


# Learning ------------------------------------------------------------------------------------

BITS = 4


def independent_bits(data: XorData) -> torch.Tensor:
    """Four tasks of no relation to one another: the parity of ``a``, of ``b``, of ``a // 2``, of ``b // 2``."""
    return torch.stack([data.a % 2, data.b % 2, (data.a // 2) % 2, (data.b // 2) % 2], dim=1).float()


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("mmoe", {"num_experts": BITS}),
        ("ple", {"num_levels": 1, "num_task_experts": 2, "num_shared_experts": 1}),
    ],
)
def test_gated_experts_learn_unrelated_tasks_that_a_shared_bottom_of_the_same_width_and_more_weights_cannot(
    name: str, options: dict[str, Any]
) -> None:
    """Each task reads a representation 2 wide: the shared bottom's last hidden layer, which 4 unrelated bits
        cannot all be linear in (4 lines cut a plane into 11 regions, not 16), or a mixture of experts 2 wide, which
        each task's gate can make its own. The shared bottom has the most parameters (1,102 against 532 and 822). (Seeds
    0-4 of the models and two draws of the data: the experts' every AUC 1.0, the shared bottom's mean 0.67 to 0.88.)"""
    tasks = tuple(Task(f"bit{i}") for i in range(BITS))
    train, test = XorData.make(4096, seed=10), XorData.make(1024, seed=11)
    experts = build(config(name, dropout=0.0, expert_dims=[4, 2], tower_dims=[], **options), tasks, seed=0)
    shared_bottom = build(config("mlp", dropout=0.0, hidden_dims=[64, 2]), tasks, seed=0)

    scores = {}
    for label, model in (("experts", experts), ("shared", shared_bottom)):
        fit(model, Rows(train, independent_bits(train)), steps=400, tasks=tasks)
        with torch.no_grad():
            logits = model(test.batch(torch.arange(len(test))))
        scores[label] = [auc(logits[:, t], independent_bits(test)[:, t]) for t in range(BITS)]

    assert sum(p.numel() for p in shared_bottom.parameters()) > sum(p.numel() for p in experts.parameters())
    assert min(scores["experts"]) > 0.95 and sum(scores["shared"]) / BITS < 0.92, scores


def clicks_and_conversions(data: XorData, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A click and a conversion for every impression, of opposite dependence on ``a``'s parity: odd ``a`` is clicked
    less (``sigmoid(-1 - 1.5 q)``, ``q`` = +1 odd, -1 even) and converts more once clicked (``sigmoid(2 q + r)``,
    ``r`` +1 or -1 by ``b``'s parity). The conversion is drawn for every row, as if clicked; a row has a label of it
    only where it is clicked (``ctcvr`` = click AND conversion)."""
    generator = torch.Generator().manual_seed(seed)
    q, r = (data.a % 2).float() * 2 - 1, (data.b % 2).float() * 2 - 1
    click = (torch.rand(len(data), generator=generator) < torch.sigmoid(-1.0 - 1.5 * q)).float()
    conversion = (torch.rand(len(data), generator=generator) < torch.sigmoid(2.0 * q + r)).float()
    return click, conversion


def test_esmm_predicts_click_and_conversion_over_every_impression_where_a_cvr_model_of_the_clicked_rows_is_biased() -> (
    None
):
    """A CVR model trained on the clicked rows alone learns ``P(conversion | click)``: over every impression it ranks
    the rows that convert once clicked first, which are the rows clicked least, and its mean is the clicked rows'
    conversion rate, far above the impressions'. ESMM, trained on every impression, gives ``P(click AND
    conversion)``: ranked and calibrated over the impression space. (Seeds 0-3 of the models and two draws of the
    data: ESMM's AUC 0.63 to 0.67 against 0.47 to 0.51, its mean within 0.015 of the rate, the CVR model's 0.39 to
    0.46 above it.)"""
    train, test = XorData.make(4096, seed=10), XorData.make(2048, seed=11)
    click, conversion = clicks_and_conversions(train, seed=110)
    esmm = build(config("esmm", dim=8, dropout=0.0, tower_dims=[16]), seed=0)
    fit(esmm, Rows(train, torch.stack([click, click * conversion], dim=1)), steps=300, tasks=CLICKS)
    clicked_only = build(config("mlp", dim=8, dropout=0.0, hidden_dims=[16]), (Task("conversion"),), seed=0)
    fit(clicked_only, Rows(train, conversion, torch.nonzero(click).squeeze(1)), steps=300, tasks=(Task("c"),))

    test_click, test_conversion = clicks_and_conversions(test, seed=111)
    ctcvr = test_click * test_conversion
    with torch.no_grad():
        batch = test.batch(torch.arange(len(test)))
        esmm_logits, cvr_logits = esmm(batch)[:, 1], clicked_only(batch)

    assert auc(esmm_logits, ctcvr) > auc(cvr_logits, ctcvr) + 0.08, (auc(esmm_logits, ctcvr), auc(cvr_logits, ctcvr))
    rate = float(ctcvr.mean())
    assert abs(float(torch.sigmoid(esmm_logits).mean()) - rate) < 0.03 < float(torch.sigmoid(cvr_logits).mean()) - rate
