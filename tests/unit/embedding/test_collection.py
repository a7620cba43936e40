import pytest
import torch
import torch.nn.functional as F

from embedding import (
    EmbeddingConfigError,
    EmbeddingTableConfig,
    JaggedIds,
    ShardedEmbeddingCollection,
    SparseFeatureError,
    SparseFeatures,
)
from support.jagged_ids import jagged


def dense_grad(collection: ShardedEmbeddingCollection, table: str) -> torch.Tensor:
    """The gradient of the table that the records describe, made dense."""
    (group,) = [group for group in collection.groups if table in (s.config.name for s in group.shards)]
    grads = group.accumulated_grads()
    assert grads is not None
    rows = torch.cat(grads.grad_rows)[grads.grad_index]
    if grads.grad_scale is not None:
        rows = rows * grads.grad_scale.unsqueeze(1)
    return torch.zeros_like(group.weight).index_add_(0, grads.ids, rows)


FEATURES = SparseFeatures(
    {
        "a": jagged([1, 2, 3, 9, 0, 4], [2, 0, 3, 1], [0.5, 1.0, 2.0, -1.0, 1.5, 3.0]),
        "b": jagged([7, 7, 0, 5], [1, 2, 0, 1]),
    },
)


@pytest.mark.parametrize("pooling", ["sum", "mean"])
def test_pooled_lookups_and_gradients_equal_embedding_bag(pooling: str) -> None:
    table = EmbeddingTableConfig("t", num_rows=10, dim=3, features=("a", "b"), pooling=pooling)  # type: ignore[arg-type]
    collection = ShardedEmbeddingCollection([table])
    weight = collection.shards["t"].weight.clone().requires_grad_(True)

    outputs = collection(FEATURES)
    coefficients = {name: torch.randn(4, 3, generator=torch.Generator().manual_seed(i)) for i, name in enumerate("ab")}
    sum((outputs[name] * coefficients[name]).sum() for name in "ab").backward()

    expected_loss = torch.zeros(())
    for name in "ab":
        feature = FEATURES[name]
        if pooling == "sum":
            expected = F.embedding_bag(
                feature.ids,
                weight,
                feature.offsets,
                mode="sum",
                per_sample_weights=feature.weights,
                include_last_offset=True,
            )
        else:
            weights = feature.weights if feature.weights is not None else torch.ones(feature.ids.numel())
            summed = F.embedding_bag(
                feature.ids,
                weight,
                feature.offsets,
                mode="sum",
                per_sample_weights=weights,
                include_last_offset=True,
            )
            expected = summed / torch.diff(feature.offsets).clamp(min=1).unsqueeze(1)
        torch.testing.assert_close(outputs[name], expected)
        expected_loss = expected_loss + (expected * coefficients[name]).sum()
    expected_loss.backward()

    assert weight.grad is not None
    torch.testing.assert_close(dense_grad(collection, "t"), weight.grad)


def test_empty_bags_pool_to_zero() -> None:
    for pooling in ("sum", "mean"):
        table = EmbeddingTableConfig("t", num_rows=10, dim=3, features=("b",), pooling=pooling)
        outputs = ShardedEmbeddingCollection([table])(SparseFeatures({"b": FEATURES["b"]}))
        torch.testing.assert_close(outputs["b"][2], torch.zeros(3))
        assert outputs["b"][0].abs().sum() > 0


def test_pooling_none_returns_one_weighted_row_per_id() -> None:
    table = EmbeddingTableConfig("t", num_rows=10, dim=3, features=("a",), pooling="none")
    collection = ShardedEmbeddingCollection([table])
    outputs = collection(SparseFeatures({"a": FEATURES["a"]}))

    weight = collection.shards["t"].weight
    feature = FEATURES["a"]
    assert feature.weights is not None
    torch.testing.assert_close(outputs["a"], weight[feature.ids] * feature.weights.unsqueeze(1))

    outputs["a"].sum().backward()
    expected = torch.zeros_like(weight).index_add_(0, feature.ids, feature.weights.unsqueeze(1).expand(-1, 3))
    torch.testing.assert_close(dense_grad(collection, "t"), expected)


def test_shared_table_serves_every_feature_from_the_same_rows() -> None:
    shared = EmbeddingTableConfig("t", num_rows=10, dim=2, features=("x", "y"))
    collection = ShardedEmbeddingCollection([shared])
    ids = JaggedIds.from_dense(torch.tensor([[3], [8]]))
    outputs = collection(SparseFeatures({"x": ids, "y": ids}))
    torch.testing.assert_close(outputs["x"], outputs["y"])
    torch.testing.assert_close(outputs["x"], collection.shards["t"].weight[[3, 8]])


@pytest.mark.parametrize("bad_id", [10, -1])
def test_out_of_range_ids_raise_naming_feature_id_and_table_size(bad_id: int) -> None:
    table = EmbeddingTableConfig("t", num_rows=10, dim=2, features=("x",))
    collection = ShardedEmbeddingCollection([table])
    features = SparseFeatures({"x": jagged([1, bad_id], [2])})
    with pytest.raises(SparseFeatureError, match=rf"feature 'x' must be in \[0, 10\).*contain {bad_id} instead"):
        collection(features)


def test_hash_policy_takes_ids_modulo_num_rows() -> None:
    table = EmbeddingTableConfig("t", num_rows=10, dim=2, features=("x",), out_of_range="hash")
    collection = ShardedEmbeddingCollection([table])
    outputs = collection(SparseFeatures({"x": jagged([23, -3], [1, 1])}))
    torch.testing.assert_close(outputs["x"], collection.shards["t"].weight[[3, 7]])


def test_out_of_range_ids_of_uniform_features_name_the_first_feature_at_fault() -> None:
    tables = [
        EmbeddingTableConfig("t", num_rows=10, dim=2, features=("x", "y")),
        EmbeddingTableConfig("u", num_rows=3, dim=2, features=("z",)),
    ]
    collection = ShardedEmbeddingCollection(tables)
    features = SparseFeatures({"x": jagged([1, 9], [2]), "y": jagged([0, 5], [2]), "z": jagged([2, 3], [2])})
    with pytest.raises(SparseFeatureError, match=r"feature 'z' must be in \[0, 3\) as table 'u'.*contain 3 instead"):
        collection(features)


def test_missing_feature_raises() -> None:
    table = EmbeddingTableConfig("t", num_rows=10, dim=2, features=("x", "y"))
    with pytest.raises(SparseFeatureError, match="must hold feature 'y' of table 't'"):
        ShardedEmbeddingCollection([table])(SparseFeatures({"x": jagged([1], [1])}))


def test_tables_are_not_parameters_and_seeded() -> None:
    table = EmbeddingTableConfig("t", num_rows=10, dim=2, features=("x",))
    collection = ShardedEmbeddingCollection([table], seed=3)
    assert list(collection.parameters()) == []
    assert collection.state_dict() == {}
    torch.testing.assert_close(
        collection.shards["t"].weight, ShardedEmbeddingCollection([table], seed=3).shards["t"].weight
    )
    assert not torch.equal(
        collection.shards["t"].weight, ShardedEmbeddingCollection([table], seed=4).shards["t"].weight
    )


def test_invalid_tables_raise() -> None:
    with pytest.raises(EmbeddingConfigError, match="`pooling` of table 't' must be one of sum, mean, none"):
        EmbeddingTableConfig("t", num_rows=10, dim=2, features=("x",), pooling="max")  # type: ignore[arg-type]
    tables = [
        EmbeddingTableConfig("t", num_rows=10, dim=2, features=("x",)),
        EmbeddingTableConfig("u", num_rows=10, dim=2, features=("x",)),
    ]
    with pytest.raises(EmbeddingConfigError, match="'x' looks up 't' and 'u'"):
        ShardedEmbeddingCollection(tables)


def test_features_already_on_the_device_move_as_themselves() -> None:
    cpu = torch.device("cpu")
    assert FEATURES.to(cpu) is FEATURES
    assert FEATURES["a"].to(cpu) is FEATURES["a"]
