"""The gradient rows a shard group records: the buffer it reuses from step to step, and the
gradients it holds, checked against plain autograd through ``nn.EmbeddingBag``."""

import torch
from torch import nn

from embedding import (
    EmbeddingTableConfig,
    JaggedIds,
    ShardedEmbeddingCollection,
    SparseFeatures,
    SparseOptimizer,
    SparseOptimizerConfig,
)
from embedding.kernels import reference
from embedding.optim_config import init_optimizer_state

TABLE = EmbeddingTableConfig("t", num_rows=20, dim=4, features=("x", "y"))
COEFFICIENT = torch.linspace(-1.0, 1.0, 4)


def batch(seed: int, batch_size: int) -> SparseFeatures:
    generator = torch.Generator().manual_seed(seed)
    features = {}
    for name in ("x", "y"):
        lengths = torch.randint(0, 4, (batch_size,), generator=generator)
        ids = torch.randint(0, TABLE.num_rows, (int(lengths.sum()),), generator=generator)
        features[name] = JaggedIds(ids, torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]))
    return SparseFeatures(features)


def backward(collection: ShardedEmbeddingCollection, features: SparseFeatures, used: tuple[str, ...]) -> None:
    outputs = collection(features)
    sum((outputs[name] * COEFFICIENT).sum() for name in used).backward()


def autograd_grad(weight: torch.Tensor, micro_batches: list[SparseFeatures], used: tuple[str, ...]) -> torch.Tensor:
    bag = nn.EmbeddingBag(TABLE.num_rows, TABLE.dim, mode="sum", _weight=weight.clone())
    for features in micro_batches:
        sum((bag(features[name].ids, features[name].offsets[:-1]) * COEFFICIENT).sum() for name in used).backward()
    assert bag.weight.grad is not None
    return bag.weight.grad


def test_buffer_is_reused_after_zero_grad_but_not_while_gradients_are_pending() -> None:
    collection = ShardedEmbeddingCollection([TABLE])
    optimizer = SparseOptimizer(collection, SparseOptimizerConfig("sgd"))
    (group,) = collection.groups

    backward(collection, batch(0, batch_size=6), ("x", "y"))
    first_step_rows = group.grads[0].grad_rows
    optimizer.step()
    optimizer.zero_grad()
    backward(collection, batch(1, batch_size=4), ("x", "y"))
    reused = group.grads[0].grad_rows
    kept = reused.clone()
    backward(collection, batch(2, batch_size=6), ("x", "y"))
    pending = group.grads[1].grad_rows

    assert reused.data_ptr() == first_step_rows.data_ptr()
    assert reused.shape == (8, TABLE.dim)  # the smaller batch takes the first rows of the buffer
    assert pending.data_ptr() != reused.data_ptr()
    assert torch.equal(reused, kept)


def test_steps_over_a_reused_buffer_equal_steps_on_autograd_gradients() -> None:
    """Batches of changing sizes, an accumulated step and an unused output: each step must
    apply exactly the gradient autograd computes, whatever the buffer held before."""
    config = SparseOptimizerConfig("adagrad", lr=0.1)
    collection = ShardedEmbeddingCollection([TABLE])
    optimizer = SparseOptimizer(collection, config)
    weight = collection.shards["t"].weight
    expected_weight, expected_state = weight.clone(), init_optimizer_state(config, TABLE.num_rows, TABLE.dim)
    steps = [
        ([batch(3, batch_size=7)], ("x", "y")),
        ([batch(4, batch_size=3)], ("x",)),
        ([batch(5, batch_size=5), batch(6, batch_size=2)], ("x", "y")),
        ([batch(7, batch_size=6)], ("y",)),
    ]

    for step, (micro_batches, used) in enumerate(steps, start=1):
        grad = autograd_grad(expected_weight, micro_batches, used)
        rows = torch.unique(torch.cat([f.ids for features in micro_batches for f in features.values()]))
        reference.fused_step(
            config, expected_weight, expected_state, rows, grad[rows], torch.arange(rows.numel()), None, step
        )
        for features in micro_batches:
            backward(collection, features, used)
        optimizer.step()
        optimizer.zero_grad()

        torch.testing.assert_close(weight, expected_weight)
        torch.testing.assert_close(collection.shards["t"].optimizer_state["sum"], expected_state["sum"])
