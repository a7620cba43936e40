"""The gradient rows a shard group records (autograd's own, in place), the buffer it reuses to
concatenate them for other ranks, and the steps they make, checked against plain autograd
through ``nn.EmbeddingBag``."""

import torch
from torch import nn

from embedding import (
    EmbeddingTableConfig,
    JaggedIds,
    ShardedEmbeddingCollection,
    SparseFeatures,
    SparseOptimizer,
)
from embedding.kernels import reference
from embedding.optimizers import init_optimizer_state
from embedding.optimizers.adagrad import AdagradConfig

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


def test_a_local_lookup_records_the_gradients_autograd_hands_it_without_a_copy() -> None:
    collection = ShardedEmbeddingCollection([TABLE])
    (group,) = collection.groups
    outputs = collection(batch(0, batch_size=5))
    upstream = {name: torch.randn(5, TABLE.dim) for name in ("x", "y")}
    expanded = torch.ones(1, TABLE.dim).expand(5, TABLE.dim)  # rows of stride 0 are read in place too
    strided = torch.randn(5, 2 * TABLE.dim)[:, ::2]  # strided columns are copied

    torch.autograd.backward([outputs["x"], outputs["y"]], [upstream["x"], upstream["y"]])
    outputs = collection(batch(1, batch_size=5))
    torch.autograd.backward([outputs["x"], outputs["y"]], [expanded, strided])

    first, second = group.grads
    assert [piece.data_ptr() for piece in first.grad_rows] == [upstream["x"].data_ptr(), upstream["y"].data_ptr()]
    assert second.grad_rows[0].data_ptr() == expanded.data_ptr()
    assert second.grad_rows[1].is_contiguous() and torch.equal(second.grad_rows[1], strided)


def test_concatenated_gradient_buffer_is_reused_only_while_no_gradients_are_pending() -> None:
    """The buffer into which lookups that send gradients to other ranks concatenate them."""
    collection = ShardedEmbeddingCollection([TABLE])
    (group,) = collection.groups
    pieces = [torch.randn(3, TABLE.dim), torch.randn(2, TABLE.dim)]

    first = group.concat_grad_rows(pieces)
    smaller = group.concat_grad_rows(pieces[:1])
    kept = smaller.clone()
    backward(collection, batch(0, batch_size=4), ("x",))  # now a record is pending
    pending = group.concat_grad_rows(pieces)

    assert torch.equal(first, torch.cat(pieces))
    assert smaller.data_ptr() == first.data_ptr() and smaller.shape == (3, TABLE.dim)
    assert pending.data_ptr() != first.data_ptr() and torch.equal(smaller, kept)


def test_steps_over_a_reused_buffer_equal_steps_on_autograd_gradients() -> None:
    """Batches of changing sizes, an accumulated step and an unused output: each step must
    apply exactly the gradient autograd computes, whatever the buffer held before."""
    config = AdagradConfig(lr=0.1)
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
            config, expected_weight, expected_state, rows, (grad[rows],), torch.arange(rows.numel()), None, step
        )
        for features in micro_batches:
            backward(collection, features, used)
        optimizer.step()
        optimizer.zero_grad()

        torch.testing.assert_close(weight, expected_weight)
        torch.testing.assert_close(collection.shards["t"].optimizer_state["sum"], expected_state["sum"])
