"""Several tasks in the zoo: the models with a linear head give one output per task from it, learn two tasks at once
and serve each task's score; the models of one output refuse several tasks in one line."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from embedding import JaggedIds, SparseFeatures
from gang import FakeGang
from recipes import ConfigError
from recsys.click.batch import CTRBatch
from recsys.click.models import PooledModel
from recsys.click.tasks import Task
from recsys.click.units import task_losses
from recsys.zoo import ZOO_MODELS, build_zoo_model
from support.zoo_data import FEATURES, NUM_DENSE, NUM_IDS, TABLES, XorData, optimizer, small_section
from units import BinaryAUC, MeanSquaredError

MULTI_TASK = ["dcn_v2", "deepfm", "dlrm", "mlp", "wide_deep"]
TASKS = (Task("xor", "binary"), Task("a_odd", "binary"), Task("b_value", "regression"))


def build(name: str, num_tasks: int = len(TASKS), **kwargs: object) -> nn.Module:
    section = small_section(name, **kwargs)  # type: ignore[arg-type]
    return build_zoo_model(section, TABLES, FEATURES, NUM_DENSE, FakeGang(), seed=3, num_tasks=num_tasks)


def with_tasks(data: XorData, rows: torch.Tensor) -> CTRBatch:
    """XorData's batch with three labels: the XOR, the parity of ``a`` alone, and ``b``'s id as a number in [0, 1)."""
    batch = data.batch(rows)
    labels = torch.stack([data.labels[rows], (data.a[rows] % 2).float(), data.b[rows].float() / NUM_IDS], dim=1)
    return CTRBatch(batch.dense, batch.sparse, labels)


def test_the_models_of_a_linear_head_say_they_take_several_tasks_and_the_others_do_not() -> None:
    able = sorted(name for name in ZOO_MODELS.registered_by("recsys") if ZOO_MODELS.get(name).config_class.multi_task)
    # On sequences: tests/unit/recsys/zoo/test_din.py, test_bst.py; the models of task towers, which need two tasks or
    # more: tests/unit/recsys/zoo/test_multitask_models.py.
    assert able == sorted([*MULTI_TASK, "bst", "din", "esmm", "mmoe", "ple"])


@pytest.mark.parametrize("name", MULTI_TASK)
def test_a_model_of_several_tasks_gives_an_output_per_task_and_trains_every_parameter(name: str) -> None:
    data = XorData.make(16, seed=0)
    model = build(name)

    logits = model(with_tasks(data, torch.arange(16)))
    assert logits.shape == (16, 3) and logits.dtype == torch.float32
    task_losses(logits, with_tasks(data, torch.arange(16)).labels, TASKS).sum().backward()
    for param_name, param in model.named_parameters():
        assert param.grad is not None and bool(param.grad.ne(0).any()), f"{name}: no gradient for {param_name}"

    empty = CTRBatch(
        torch.zeros(0, NUM_DENSE),
        SparseFeatures({feature: JaggedIds.from_dense(torch.zeros(0, 1, dtype=torch.int64)) for feature in FEATURES}),
        torch.zeros(0, 3),
    )
    assert model(empty).shape == (0, 3)


@pytest.mark.parametrize("name", ["mlp", "deepfm"])
def test_one_model_learns_every_task_at_once(name: str) -> None:
    train, test = XorData.make(4096, seed=10), XorData.make(1024, seed=11)
    model = build(name, dim=8, hidden_dims=[32, 16])
    step = optimizer(model, lr=0.01)
    generator = torch.Generator().manual_seed(0)
    for _ in range(150):
        batch = with_tasks(train, torch.randint(0, len(train), (64,), generator=generator))
        task_losses(model(batch), batch.labels, TASKS).mean().backward()
        step.step()
        step.zero_grad()

    model.eval()
    with torch.no_grad():
        batch = with_tasks(test, torch.arange(len(test)))
        logits = model(batch)
    for column in (0, 1):
        auc = BinaryAUC()
        auc.update(torch.sigmoid(logits[:, column]), batch.labels[:, column].long())
        assert float(auc.compute()) > 0.7, f"{name}: task {TASKS[column].name} reached AUC {float(auc.compute()):.3f}"
    mse, baseline = MeanSquaredError(), MeanSquaredError()
    mse.update(logits[:, 2], batch.labels[:, 2])
    baseline.update(torch.full_like(batch.labels[:, 2], float(batch.labels[:, 2].mean())), batch.labels[:, 2])
    assert float(mse.compute()) < 0.5 * float(baseline.compute())


@pytest.mark.parametrize("name", MULTI_TASK)
def test_the_served_dense_part_gives_each_tasks_score_a_binarys_probability_a_regressions_number(name: str) -> None:
    model = build(name).eval()
    assert isinstance(model, PooledModel)
    model.tasks = TASKS
    batch = with_tasks(XorData.make(8, seed=1), torch.arange(8))
    serving = model.dense_for_serving()
    pooled_by_role = {role: module(batch.sparse) for role, (module, _) in model.lookups().items()}
    pooled = [pooled_by_role[role][feature] for role, (_, features) in model.lookups().items() for feature in features]

    with torch.no_grad():
        scores = serving.module(batch.dense, pooled)
        logits = model(batch)

    assert serving.outputs == ("xor", "a_odd", "b_value")
    assert torch.allclose(scores[:, :2], torch.sigmoid(logits[:, :2])) and torch.allclose(scores[:, 2], logits[:, 2])


@pytest.mark.parametrize("name", ["fm", "logistic_regression"])
def test_a_model_of_one_output_refuses_several_tasks_in_one_line(name: str) -> None:
    with pytest.raises(ConfigError) as error:
        build(name, num_tasks=2)

    assert str(error.value) == (
        f"`dataset.labels` names 2 tasks, so the model must give an output per task (bst, dcn_v2, deepfm, din, dlrm, "
        f"esmm, mlp, mmoe, ple, wide_deep), but '{name}' gives one."
    )
    assert build(name, num_tasks=1)(with_tasks(XorData.make(4, seed=0), torch.arange(4))).shape == (4,)
