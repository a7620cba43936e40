import pytest
import torch
from torch import nn

from embedding import (
    CombinedOptimizer,
    EmbeddingTableConfig,
    ShardedEmbeddingCollection,
    SparseOptimizer,
)
from embedding.optimizers.adam import AdamConfig
from recipes.training.parallel import DenseGradients, tensors_changed_by_step


def _model_with_grads(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))
    model(torch.randn(4, 5)).square().sum().backward()
    return model


def _groups(model: nn.Module) -> list[dict[str, object]]:
    return [{"params": list(model.parameters())}]


def test_scale_and_clip_returns_the_scaled_norm_and_clips_like_torch() -> None:
    ours, theirs = _model_with_grads(0), _model_with_grads(0)
    for param in theirs.parameters():
        param.grad.mul_(0.3)
    expected = torch.nn.utils.clip_grad_norm_(theirs.parameters(), max_norm=0.5)

    norm = DenseGradients(_groups(ours)).scale_and_clip_(0.3, 0.5)

    assert norm == pytest.approx(float(expected)) and norm > 0.5
    for param, reference in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(param.grad, reference.grad)


def test_scale_and_clip_only_scales_gradients_under_the_limit() -> None:
    model = _model_with_grads(1)
    before = [param.grad.clone() for param in model.parameters()]

    DenseGradients(_groups(model)).scale_and_clip_(0.5, float("inf"))

    for param, grad in zip(model.parameters(), before):
        assert torch.equal(param.grad, grad * 0.5)


def test_scale_multiplies_every_gradient_and_skips_parameters_without_one() -> None:
    model = _model_with_grads(2)
    frozen = nn.Parameter(torch.ones(2))
    before = [param.grad.clone() for param in model.parameters()]

    DenseGradients([{"params": [*model.parameters(), frozen]}]).scale_(0.25)

    for param, grad in zip(model.parameters(), before):
        torch.testing.assert_close(param.grad, grad * 0.25)
    assert frozen.grad is None


def test_no_gradients_have_norm_zero() -> None:
    assert DenseGradients([{"params": [nn.Parameter(torch.ones(3))]}]).scale_and_clip_(1.0, 1.0) == 0.0


def test_tensors_changed_by_step_are_parameters_dense_state_and_sparse_tables_with_theirs() -> None:
    model = _model_with_grads(3)
    dense = torch.optim.Adam(model.parameters())
    dense.step()
    collection = ShardedEmbeddingCollection([EmbeddingTableConfig("t", num_rows=12, dim=4, features=("x",))])
    sparse = SparseOptimizer(collection, AdamConfig(lr=0.1))

    changed = tensors_changed_by_step(CombinedOptimizer(dense, sparse))

    dense_state = [value for state in dense.state.values() for value in state.values()]
    assert {id(tensor) for tensor in [*model.parameters(), *dense_state]} <= {id(tensor) for tensor in changed}
    # A shard's table and state are views of its group's buffers, which the list holds.
    shard = collection.shards["t"]
    storages = {tensor.untyped_storage().data_ptr() for tensor in changed}
    assert all(t.untyped_storage().data_ptr() in storages for t in [shard.weight, *shard.optimizer_state.values()])
    assert len(changed) == len(list(model.parameters())) + len(dense_state) + 1 + len(shard.optimizer_state)
