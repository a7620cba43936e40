import io

import pytest
import torch
from torch import nn

from embedding import (
    CombinedOptimizer,
    EmbeddingTableConfig,
    JaggedIds,
    ShardedEmbeddingCollection,
    SparseFeatures,
    SparseOptimizer,
)
from embedding.kernels import reference
from embedding.optimizers import init_optimizer_state, sparse_optimizer_config
from embedding.optimizers.adagrad import AdagradConfig
from embedding.optimizers.adam import AdamConfig
from embedding.optimizers.sgd import SGDConfig

TABLE = EmbeddingTableConfig("t", num_rows=12, dim=4, features=("x", "y"))


def batch(seed: int, batch_size: int = 5) -> SparseFeatures:
    generator = torch.Generator().manual_seed(seed)
    features = {}
    for name in ("x", "y"):
        lengths = torch.randint(0, 4, (batch_size,), generator=generator)
        ids = torch.randint(0, 12, (int(lengths.sum()),), generator=generator)
        weights = torch.rand(ids.numel(), generator=generator)
        features[name] = JaggedIds(ids, torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]), weights)
    return SparseFeatures(features)


def concat(first: SparseFeatures, second: SparseFeatures) -> SparseFeatures:
    def cat(a: JaggedIds, b: JaggedIds) -> JaggedIds:
        assert a.weights is not None and b.weights is not None
        offsets = torch.cat([a.offsets, b.offsets[1:] + a.offsets[-1]])
        return JaggedIds(torch.cat([a.ids, b.ids]), offsets, torch.cat([a.weights, b.weights]))

    return SparseFeatures({name: cat(first[name], second[name]) for name in first})


def backward(collection: ShardedEmbeddingCollection, features: SparseFeatures) -> None:
    outputs = collection(features)
    coefficient = torch.linspace(-1.0, 1.0, 4)
    sum((output * coefficient).sum() for output in outputs.values()).backward()


def autograd_grad(weight: torch.Tensor, features: SparseFeatures) -> torch.Tensor:
    """The gradient that plain autograd through ``nn.EmbeddingBag`` computes for the same loss."""
    bag = nn.EmbeddingBag(12, 4, mode="sum", _weight=weight.clone())
    coefficient = torch.linspace(-1.0, 1.0, 4)
    loss = sum(
        (bag(f.ids, f.offsets[:-1], per_sample_weights=f.weights) * coefficient).sum() for f in features.values()
    )
    loss.backward()
    assert bag.weight.grad is not None
    return bag.weight.grad


@pytest.mark.parametrize("name", ["sgd", "rowwise_adagrad", "adagrad", "adam", "adamw"])
def test_step_equals_reference_kernel_on_autograd_gradient(name: str) -> None:
    config = sparse_optimizer_config(name, lr=0.1, weight_decay=0.01)
    collection = ShardedEmbeddingCollection([TABLE])
    optimizer = SparseOptimizer(collection, config)
    weight = collection.shards["t"].weight
    features = batch(0)

    grad = autograd_grad(weight, features)
    rows = torch.unique(torch.cat([f.ids for f in features.values()]))
    expected_weight, expected_state = weight.clone(), init_optimizer_state(config, 12, 4)
    for step in (1, 2):
        reference.fused_step(
            config, expected_weight, expected_state, rows, (grad[rows],), torch.arange(rows.numel()), None, step
        )

    for _ in (1, 2):
        backward(collection, features)
        optimizer.step()
        optimizer.zero_grad()

    torch.testing.assert_close(weight, expected_weight)
    for key, tensor in expected_state.items():
        torch.testing.assert_close(collection.shards["t"].optimizer_state[key], tensor)
    assert optimizer.step_count == 2


def test_gradient_accumulation_over_micro_batches_equals_one_batch() -> None:
    config = AdamConfig(lr=0.1)
    accumulated, whole = ShardedEmbeddingCollection([TABLE]), ShardedEmbeddingCollection([TABLE])
    accumulated_optimizer, whole_optimizer = SparseOptimizer(accumulated, config), SparseOptimizer(whole, config)

    backward(accumulated, batch(1))
    backward(accumulated, batch(2))
    accumulated_optimizer.step()
    backward(whole, concat(batch(1), batch(2)))
    whole_optimizer.step()

    torch.testing.assert_close(accumulated.shards["t"].weight, whole.shards["t"].weight)
    torch.testing.assert_close(
        accumulated.shards["t"].optimizer_state["exp_avg_sq"], whole.shards["t"].optimizer_state["exp_avg_sq"]
    )


def test_scaled_gradients_equal_a_step_on_the_scaled_loss() -> None:
    config = AdagradConfig(lr=0.1)
    scaled, reference_tables = ShardedEmbeddingCollection([TABLE]), ShardedEmbeddingCollection([TABLE])
    scaled_optimizer = CombinedOptimizer(
        torch.optim.SGD([nn.Parameter(torch.zeros(1))]), SparseOptimizer(scaled, config)
    )
    reference_optimizer = SparseOptimizer(reference_tables, config)

    backward(scaled, batch(1))
    scaled_optimizer.scale_sparse_gradients(0.25)
    scaled_optimizer.step()
    outputs = reference_tables(batch(1))
    coefficient = torch.linspace(-1.0, 1.0, 4)
    (0.25 * sum((output * coefficient).sum() for output in outputs.values())).backward()
    reference_optimizer.step()

    torch.testing.assert_close(scaled.shards["t"].weight, reference_tables.shards["t"].weight)
    # The factor applies to one step only.
    scaled_optimizer.zero_grad()
    reference_optimizer.zero_grad()
    backward(scaled, batch(2))
    scaled_optimizer.step()
    backward(reference_tables, batch(2))
    reference_optimizer.step()
    torch.testing.assert_close(scaled.shards["t"].weight, reference_tables.shards["t"].weight)


def test_zero_grad_drops_recorded_gradients_and_table_override_wins() -> None:
    sgd_table = EmbeddingTableConfig("s", num_rows=12, dim=4, features=("z",), optimizer=SGDConfig())
    collection = ShardedEmbeddingCollection([TABLE, sgd_table])
    optimizer = SparseOptimizer(collection, AdamConfig())
    assert collection.shards["s"].optimizer_state == {}
    assert set(collection.shards["t"].optimizer_state) == {"exp_avg", "exp_avg_sq"}

    before = {name: shard.weight.clone() for name, shard in collection.shards.items()}
    features = SparseFeatures({**batch(3), "z": batch(4)["x"]})
    backward(collection, features)
    optimizer.zero_grad()
    optimizer.step()
    for name, shard in collection.shards.items():
        torch.testing.assert_close(shard.weight, before[name])


def test_lambda_lr_scales_dense_and_sparse_learning_rates() -> None:
    sgd = SGDConfig(lr=1.0)
    collection = ShardedEmbeddingCollection([TABLE])
    dense = nn.Linear(4, 1)
    optimizer = CombinedOptimizer(torch.optim.SGD(dense.parameters(), lr=0.5), SparseOptimizer(collection, sgd))
    # LambdaLR applies the factor of step 0 as it is built.
    torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.1 ** (step + 1))
    assert [group["lr"] for group in optimizer.param_groups] == pytest.approx([0.05, 0.1])

    weight = collection.shards["t"].weight
    features = batch(5)
    grad = autograd_grad(weight, features)
    expected = weight - 0.1 * grad
    dense_before = dense.weight.detach().clone()
    outputs = collection(features)
    coefficient = torch.linspace(-1.0, 1.0, 4)
    loss = sum((output * coefficient).sum() for output in outputs.values()) + dense(torch.ones(1, 4)).sum()
    loss.backward()
    optimizer.step()

    torch.testing.assert_close(weight, expected)
    torch.testing.assert_close(dense.weight.detach(), dense_before - 0.05 * torch.ones(1, 4))


def test_state_dict_round_trips_through_weights_only_load() -> None:
    collection = ShardedEmbeddingCollection([TABLE])
    dense = nn.Linear(4, 1)
    optimizer = CombinedOptimizer(torch.optim.Adam(dense.parameters()), SparseOptimizer(collection))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)
    backward(collection, batch(6))
    dense(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    scheduler.step()

    buffer = io.BytesIO()
    torch.save({"optimizer": optimizer.state_dict(), "sparse": collection.sharded_state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)

    restored_collection = ShardedEmbeddingCollection([TABLE], seed=1)
    restored = CombinedOptimizer(torch.optim.Adam(nn.Linear(4, 1).parameters()), SparseOptimizer(restored_collection))
    restored.load_state_dict(saved["optimizer"])
    restored_collection.load_sharded_state_dict([saved["sparse"]])

    assert restored.sparse.step_count == 1
    assert [g["lr"] for g in restored.param_groups] == [g["lr"] for g in optimizer.param_groups]
    torch.testing.assert_close(restored_collection.shards["t"].weight, collection.shards["t"].weight)
    torch.testing.assert_close(
        restored_collection.shards["t"].optimizer_state["sum"], collection.shards["t"].optimizer_state["sum"]
    )


def test_weight_decay_by_frequency_counts_each_rows_steps_in_state_that_is_saved_and_accounted() -> None:
    config = sparse_optimizer_config("rowwise_adagrad", lr=0.1, weight_decay=0.01, weight_decay_by_frequency=True)
    collection = ShardedEmbeddingCollection([TABLE])
    optimizer = SparseOptimizer(collection, config)
    features = batch(0)
    for _ in range(3):
        backward(collection, features)
        optimizer.step()
        optimizer.zero_grad()

    expected = torch.zeros(12)
    expected[torch.unique(torch.cat([f.ids for f in features.values()]))] = 3.0
    torch.testing.assert_close(collection.shards["t"].optimizer_state["touches"], expected)
    assert optimizer.state_bytes == 12 * (1 + 1) * 4  # the row's squared-gradient sum and its touches
    restored = ShardedEmbeddingCollection([TABLE], seed=1)
    SparseOptimizer(restored, config)
    restored.load_sharded_state_dict([collection.sharded_state_dict()])
    torch.testing.assert_close(restored.shards["t"].optimizer_state["touches"], expected)
