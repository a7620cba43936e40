"""The bags of a group's lookup: the CPU's compiled pass against the torch paths an accelerator takes, and the
sort a training forward makes for the update."""

import pytest
import torch

from embedding import EmbeddingTableConfig, JaggedIds, ShardedEmbeddingCollection, SparseFeatureError, SparseFeatures
from embedding.bags import (
    group_bags,
    ids_a_feature_at_a_time,
    jagged_offsets,
    table_features,
    uniform_ids,
    uniform_offsets,
)
from embedding.sharding import ShardGroup
from support.jagged_ids import jagged

TABLES = [
    EmbeddingTableConfig("t", num_rows=30, dim=2, features=("a", "b")),
    EmbeddingTableConfig("u", num_rows=7, dim=2, features=("c",), out_of_range="hash"),
    EmbeddingTableConfig("v", num_rows=5, dim=2, features=("d",), out_of_range="hash"),
]

# Features with as many ids and bags each (the first three) take the batched torch path on an accelerator;
# the others a feature at a time. The hashed features, c and d, hold negative ids and ids past their table.
FEATURES = {
    "one id per bag": {name: JaggedIds.from_dense(torch.tensor([[1], [4], [23]]) + i) for i, name in enumerate("abcd")},
    "several ids per bag": {
        name: jagged([1 + i, 2, 23, -9 if name in "cd" else 0], [2, 0, 2]) for i, name in enumerate("abcd")
    },
    "weighted": {name: jagged([1, 2 + i, 9], [1, 1, 1], [0.5, 2.0, 1.0 + i]) for i, name in enumerate("abcd")},
    "as many ids as bags, not one each": {name: jagged([1 + i, 2, 3], [0, 2, 1]) for i, name in enumerate("abcd")},
    "jagged": {
        name: jagged([3] * (i + 1) + [-40 + i if name in "cd" else 29], [1, i + 1]) for i, name in enumerate("abcd")
    },
}


def torch_bags(group: ShardGroup, features: SparseFeatures, uniform: bool) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """The ids, offsets and one-id flag of the torch paths."""
    pairs = table_features(group)
    jagged_ids = [features[name] for _, name in pairs]
    buffer_offsets = [group.buffer_offsets[i] for i, shard in enumerate(group.shards) for _ in shard.config.features]
    if uniform:
        return uniform_ids(pairs, jagged_ids, buffer_offsets), *uniform_offsets(pairs, jagged_ids)
    return ids_a_feature_at_a_time(pairs, jagged_ids, buffer_offsets), jagged_offsets(pairs, jagged_ids), False


@pytest.mark.parametrize("case", FEATURES)
def test_the_compiled_pass_makes_the_bags_of_the_torch_paths(case: str) -> None:
    (group,) = ShardedEmbeddingCollection(TABLES).groups
    features = SparseFeatures(FEATURES[case])

    bags = group_bags(group, features)

    paths = [torch_bags(group, features, uniform=False)]
    if case != "jagged":
        paths.append(torch_bags(group, features, uniform=True))
    for ids, offsets, _ in paths:
        assert torch.equal(bags.ids, ids)
        assert torch.equal(bags.offsets, offsets)
    assert bags.one_id_per_bag == paths[-1][2] == (case in ("one id per bag", "weighted"))
    assert bags.ids.min() >= 0 and bags.ids.max() < group.weight.size(0)
    if case == "weighted":
        assert bags.scales is not None
        assert bags.scales.tolist() == [weight for i in range(4) for weight in (0.5, 2.0, 1.0 + i)]


def test_features_change_nothing_in_place() -> None:
    (group,) = ShardedEmbeddingCollection(TABLES).groups
    features = SparseFeatures(FEATURES["several ids per bag"])
    before = {name: feature.ids.clone() for name, feature in features.items()}

    group_bags(group, features, sort=True)

    assert all(torch.equal(features[name].ids, ids) for name, ids in before.items())


def test_int32_ids_are_read_as_int64() -> None:
    (group,) = ShardedEmbeddingCollection(TABLES).groups
    features = {name: JaggedIds(ids.ids.to(torch.int32), ids.offsets) for name, ids in FEATURES["jagged"].items()}

    bags = group_bags(group, SparseFeatures(features))

    assert bags.ids.dtype == torch.int64
    assert torch.equal(bags.ids, group_bags(group, SparseFeatures(FEATURES["jagged"])).ids)


@pytest.mark.parametrize("case", FEATURES)
def test_a_sort_for_the_update_is_torch_stable_sort_of_the_rows(case: str) -> None:
    (group,) = ShardedEmbeddingCollection(TABLES).groups

    bags = group_bags(group, SparseFeatures(FEATURES[case]), sort=True)

    assert bags.sorted_ids is not None
    keys, order = torch.sort(bags.ids, stable=True)
    assert bags.sorted_ids.keys.dtype == torch.int32
    assert torch.equal(bags.sorted_ids.keys.long(), keys)
    assert torch.equal(bags.sorted_ids.order, order)
    assert group_bags(group, SparseFeatures(FEATURES[case])).sorted_ids is None


@pytest.mark.parametrize("uniform", [True, False])
def test_an_id_out_of_range_names_the_first_feature_at_fault_and_its_extreme(uniform: bool) -> None:
    tables = [
        EmbeddingTableConfig("t", num_rows=10, dim=2, features=("x", "y")),
        EmbeddingTableConfig("u", num_rows=3, dim=2, features=("z",)),
    ]
    (group,) = ShardedEmbeddingCollection(tables).groups
    z = jagged([2, -1, 7], [3]) if uniform else jagged([2, -1, 7, 0], [4])
    features = SparseFeatures({"x": jagged([1, 9, 0], [3]), "y": jagged([0, 5, 1], [3]), "z": z})

    with pytest.raises(SparseFeatureError, match=r"feature 'z' must be in \[0, 3\) as table 'u'.*contain -1 instead"):
        group_bags(group, features, sort=True)


def test_a_training_forward_on_one_rank_hands_its_sort_to_the_update() -> None:
    collection = ShardedEmbeddingCollection([TABLES[0]])
    features = SparseFeatures({"a": jagged([5, 1, 5], [1, 1, 1]), "b": jagged([2, 2, 29], [1, 1, 1])})

    collection.eval()
    collection(features)["a"].sum().backward()
    (group,) = collection.groups
    assert group.grads[0].sorted_ids is None  # no sort where no update follows

    group.grads.clear()
    collection.train()
    outputs = collection(features)
    (outputs["a"].sum() + outputs["b"].sum()).backward()
    (record,) = group.grads
    assert record.sorted_ids is not None
    assert torch.equal(record.sorted_ids.keys.long(), torch.sort(record.ids, stable=True).values)
