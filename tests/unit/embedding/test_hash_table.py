"""Hash tables through the collection and its sparse optimizer, on one process: rows of any id,
default rows, reused slots, eval mode, gradient accumulation, checkpoints and configuration."""

import io
from typing import Any

import pytest
import torch

from embedding import (
    EmbeddingConfigError,
    EmbeddingTableConfig,
    EvictionConfig,
    HashPolicy,
    JaggedIds,
    ShardedEmbeddingCollection,
    ShardedStateError,
    SparseFeatures,
    SparseOptimizer,
    SparseOptimizerConfig,
    TableFullError,
)
from embedding.eviction import TtlConfig
from embedding.hash_index import HashIndex
from embedding.optimizers.adam import AdamConfig
from embedding.optimizers.rowwise_adagrad import RowwiseAdagradConfig

DIM = 3
ROWWISE = RowwiseAdagradConfig(lr=0.5)


def hash_table(capacity: int = 8, policy: HashPolicy | None = None, **kwargs: Any) -> EmbeddingTableConfig:
    return EmbeddingTableConfig("t", capacity, DIM, ("x",), kind="hash", hash_policy=policy or HashPolicy(), **kwargs)


def batch(*ids: int, feature: str = "x") -> SparseFeatures:
    """One id per sample."""
    return SparseFeatures({feature: JaggedIds(torch.tensor(ids, dtype=torch.int64), torch.arange(len(ids) + 1))})


def build(
    table: EmbeddingTableConfig, config: SparseOptimizerConfig = ROWWISE, seed: int = 0
) -> tuple[ShardedEmbeddingCollection, SparseOptimizer]:
    collection = ShardedEmbeddingCollection([table], seed=seed)
    return collection, SparseOptimizer(collection, config)


def backward(collection: ShardedEmbeddingCollection, features: SparseFeatures) -> dict[str, torch.Tensor]:
    """Forward, and backward of a fixed linear loss of every output; the outputs, detached."""
    outputs = collection(features)
    loss = sum(
        (output * torch.linspace(-1.0, 2.0, output.numel()).view_as(output)).sum() for output in outputs.values()
    )
    assert isinstance(loss, torch.Tensor)
    loss.backward()
    return {name: output.detach().clone() for name, output in outputs.items()}


def train(
    collection: ShardedEmbeddingCollection, optimizer: SparseOptimizer, features: SparseFeatures
) -> dict[str, torch.Tensor]:
    outputs = backward(collection, features)
    optimizer.step()
    optimizer.zero_grad()
    return outputs


def index_of(collection: ShardedEmbeddingCollection, table: str = "t") -> HashIndex:
    dynamic = collection.shards[table].dynamic
    assert dynamic is not None
    return dynamic.index


def slot_of(collection: ShardedEmbeddingCollection, key: int, table: str = "t") -> int:
    return int(index_of(collection, table).find(torch.tensor([key]).numpy())[0])


def buffers(collection: ShardedEmbeddingCollection) -> dict[str, torch.Tensor]:
    """Copies of every group's whole buffer (default row included) and optimizer state."""
    copies = {}
    for number, group in enumerate(collection.groups):
        copies[f"{number}/weight"] = group.weight.clone()
        copies.update({f"{number}/{name}": tensor.clone() for name, tensor in group.optimizer_state.items()})
    return copies


EXTREME_IDS = (-(2**63), -1, 0, 1, 2**63 - 1, 2**62 + 12345, -(10**18))


def test_any_int64_id_gets_a_row_of_its_own() -> None:
    collection, optimizer = build(hash_table(capacity=8))
    outputs = train(collection, optimizer, batch(*EXTREME_IDS))["x"]
    slots = [slot_of(collection, key) for key in EXTREME_IDS]
    assert sorted(slots) == list(range(len(EXTREME_IDS)))
    assert all(bool(row.abs().sum() > 0) for row in outputs)
    assert torch.unique(outputs, dim=0).size(0) == len(EXTREME_IDS)
    # Read back after the step: each id its own updated row.
    assert torch.equal(collection(batch(*EXTREME_IDS))["x"], collection.shards["t"].weight[slots])


def test_weighted_mean_pooling_of_a_hash_table_pools_the_rows_its_ids_hold() -> None:
    collection, _ = build(hash_table(capacity=8, pooling="mean"))
    ids = torch.tensor([5, -7, 5, 2**63 - 1, 9], dtype=torch.int64)
    features = SparseFeatures({"x": JaggedIds(ids, torch.tensor([0, 3, 3, 5]), torch.tensor([1.0, 2.0, 0.5, 1, 3]))})
    output = collection(features)["x"]
    slots = [slot_of(collection, key) for key in ids.tolist()]
    assert sorted(set(slots)) == [0, 1, 2, 3]
    rows = collection.groups[0].weight[slots]
    expected = torch.stack([(rows[0] + 2 * rows[1] + 0.5 * rows[2]) / 3, torch.zeros(DIM), (rows[3] + 3 * rows[4]) / 2])
    torch.testing.assert_close(output, expected)


def test_an_id_not_admitted_reads_zeros_and_a_step_leaves_its_default_row_and_state_alone() -> None:
    collection, optimizer = build(hash_table(capacity=8, policy=HashPolicy(min_count=2)))
    default_row = index_of(collection).capacity

    outputs = backward(collection, batch(11, 22, 22))  # 11 seen once: no row; 22 twice: admitted
    assert torch.equal(outputs["x"][0], torch.zeros(DIM))
    assert slot_of(collection, 11) == -1 and slot_of(collection, 22) == 0
    before = buffers(collection)
    optimizer.step()
    optimizer.zero_grad()
    after = buffers(collection)
    assert torch.equal(after["0/weight"][default_row], torch.zeros(DIM))
    assert after["0/sum"][default_row] == 0.0
    changed = [
        row for row in range(default_row + 1) if not torch.equal(after["0/weight"][row], before["0/weight"][row])
    ]
    assert changed == [0]  # only id 22's row
    assert torch.count_nonzero(after["0/sum"]).item() == 1 and after["0/sum"][0] > 0

    # A step in which no id has a row changes nothing at all.
    unknown = batch(33, 44, 55)
    before = buffers(collection)
    assert torch.equal(train(collection, optimizer, unknown)["x"], torch.zeros(3, DIM))
    after = buffers(collection)
    assert all(torch.equal(after[name], before[name]) for name in before)


@pytest.mark.parametrize(
    "config, fresh",
    [
        (RowwiseAdagradConfig(lr=0.5, initial_accumulator_value=0.25), {"sum": 0.25}),
        (AdamConfig(lr=0.1), {"exp_avg": 0.0, "exp_avg_sq": 0.0}),
    ],
    ids=["rowwise_adagrad", "adam"],
)
def test_a_slot_reused_by_a_new_id_starts_from_its_initial_values_and_fresh_optimizer_state(
    config: SparseOptimizerConfig, fresh: dict[str, float]
) -> None:
    table = hash_table(capacity=1, policy=HashPolicy(eviction=EvictionConfig("lru")))
    collection, optimizer = build(table, config)
    for _ in range(3):
        train(collection, optimizer, batch(100))
    state = collection.shards["t"].optimizer_state
    assert all(bool((state[name][0] != value).any()) for name, value in fresh.items())  # id 100 trained

    # Id 200 evicts id 100 and reads the row it would read in a table that never held id 100, whose
    # optimizer took as many steps with nothing to update.
    reference, reference_optimizer = build(table, config)
    for _ in range(3):
        reference_optimizer.step()
    outputs = backward(collection, batch(200))
    assert slot_of(collection, 100) == -1 and slot_of(collection, 200) == 0
    assert all(bool((state[name][0] == value).all()) for name, value in fresh.items())
    assert torch.equal(outputs["x"], backward(reference, batch(200))["x"])
    optimizer.step()
    reference_optimizer.step()
    assert torch.equal(collection.shards["t"].weight[0], reference.shards["t"].weight[0])
    for name in fresh:
        assert torch.equal(state[name][0], reference.shards["t"].optimizer_state[name][0]), name


def test_an_ids_initial_row_depends_on_the_seed_and_table_alone_not_its_slot_or_history() -> None:
    key = -123_456_789
    busy, busy_optimizer = build(
        hash_table(capacity=4, policy=HashPolicy(eviction=EvictionConfig("lru")), init_scale=0.05)
    )
    for step in range(6):  # fill, then evict, so that the id lands in a reused slot
        train(busy, busy_optimizer, batch(step * 10, step * 10 + 1))
    busy_row = backward(busy, batch(key))["x"]
    assert index_of(busy).statistics()["evicted"] > 0

    fresh, fresh_optimizer = build(hash_table(capacity=64, init_scale=0.05))
    train(fresh, fresh_optimizer, batch(-(2**63)))
    fresh_row = backward(fresh, batch(key))["x"]
    assert slot_of(busy, key) == 0 and slot_of(fresh, key) == 1  # a reused slot, and a never used one
    assert torch.equal(busy_row, fresh_row)
    assert bool(busy_row.abs().max() <= 0.05) and bool(busy_row.abs().sum() > 0)

    other_seed, _ = build(hash_table(capacity=64, init_scale=0.05), seed=1)
    assert not torch.equal(backward(other_seed, batch(key))["x"], fresh_row)
    other_name = EmbeddingTableConfig("u", 64, DIM, ("x",), kind="hash", init_scale=0.05)
    assert not torch.equal(backward(ShardedEmbeddingCollection([other_name]), batch(key))["x"], fresh_row)


def test_eval_mode_inserts_nothing_and_reads_zeros_for_unknown_ids() -> None:
    collection, optimizer = build(hash_table(capacity=8))
    train(collection, optimizer, batch(1, 2))
    known = collection.shards["t"].weight[[slot_of(collection, 1), slot_of(collection, 2)]].clone()
    index = index_of(collection)
    before = [array.copy() for array in (index.index, index.keys, index.last_seen, index.frequency, index.counters)]

    collection.eval()
    with torch.no_grad():
        outputs = collection(batch(2, 3, 1, -4))["x"]
    assert torch.equal(outputs, torch.stack([known[1], torch.zeros(DIM), known[0], torch.zeros(DIM)]))
    after = [index.index, index.keys, index.last_seen, index.frequency, index.counters]
    assert all((old == new).all() for old, new in zip(before, after))
    assert slot_of(collection, 3) == -1

    collection.train()
    collection(batch(3))
    assert slot_of(collection, 3) == 2


def test_gradient_accumulation_never_evicts_a_slot_used_by_an_earlier_micro_batch() -> None:
    table = hash_table(capacity=2, policy=HashPolicy(eviction=EvictionConfig("lru")))
    accumulated, optimizer = build(table)
    reference, reference_optimizer = build(table)
    for collection, collection_optimizer in ((accumulated, optimizer), (reference, reference_optimizer)):
        train(collection, collection_optimizer, batch(1))  # id 1: slot 0, step 0
        train(collection, collection_optimizer, batch(2))  # id 2: slot 1, step 1

    # Step 2: the first micro-batch looks id 1 up; the second brings id 3, which must take the slot of
    # id 2 although id 1 is the least recently used before this step.
    backward(accumulated, batch(1))
    backward(accumulated, batch(3))
    optimizer.step()
    assert slot_of(accumulated, 1) == 0 and slot_of(accumulated, 2) == -1 and slot_of(accumulated, 3) == 1
    train(reference, reference_optimizer, batch(1))
    assert torch.equal(accumulated.shards["t"].weight[0], reference.shards["t"].weight[0])
    assert torch.equal(
        accumulated.shards["t"].optimizer_state["sum"][0], reference.shards["t"].optimizer_state["sum"][0]
    )
    optimizer.zero_grad()

    # Both slots looked up by the first micro-batch: the second's new id finds no row, and reads zeros.
    backward(accumulated, batch(1, 3))
    outputs = backward(accumulated, batch(4))
    optimizer.step()
    assert torch.equal(outputs["x"], torch.zeros(1, DIM))
    assert [slot_of(accumulated, key) for key in (1, 3, 4)] == [0, 1, -1]


def test_eviction_none_raises_table_full_in_forward() -> None:
    collection, optimizer = build(hash_table(capacity=2, policy=HashPolicy(eviction=EvictionConfig("none"))))
    train(collection, optimizer, batch(1, 2))
    with pytest.raises(TableFullError, match="Table 't' is full: all 2 rows"):
        collection(batch(2, 3))


# Checkpoints.

TABLES = [
    EmbeddingTableConfig(
        "user", 6, DIM, ("u",), kind="hash", hash_policy=HashPolicy(min_count=2, admit_probability=0.8)
    ),
    EmbeddingTableConfig(
        "item",
        5,
        DIM,
        ("i",),
        pooling="mean",
        kind="hash",
        hash_policy=HashPolicy(eviction=EvictionConfig("lfu")),
        optimizer=AdamConfig(lr=0.1),
    ),
    EmbeddingTableConfig("fixed", 10, DIM, ("f",)),
]


def step_features(step: int) -> SparseFeatures:
    generator = torch.Generator().manual_seed(step)
    vocabulary = torch.randint(-(2**62), 2**62, (20,), generator=torch.Generator().manual_seed(0))
    features = {}
    for name, rows in (("u", vocabulary), ("i", vocabulary), ("f", torch.arange(10))):
        lengths = torch.randint(0, 4, (6,), generator=generator)
        ids = rows[torch.randint(0, rows.numel(), (int(lengths.sum()),), generator=generator)]
        features[name] = JaggedIds(ids, torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]))
    return SparseFeatures(features)


def build_tables() -> tuple[ShardedEmbeddingCollection, SparseOptimizer]:
    collection = ShardedEmbeddingCollection(TABLES, seed=7)
    return collection, SparseOptimizer(collection, ROWWISE)


def test_sharded_state_dict_resumes_bit_exact_in_a_fresh_collection() -> None:
    original, optimizer = build_tables()
    for step in range(8):
        train(original, optimizer, step_features(step))
    buffer = io.BytesIO()
    torch.save({"sparse": original.sharded_state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    expected = [train(original, optimizer, step_features(step)) for step in range(8, 16)]
    stats = {name: index_of(original, name).statistics() for name in ("user", "item")}
    assert stats["user"]["rejected"] > 0 and stats["item"]["evicted"] > 0  # admission and eviction at work

    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    resumed, resumed_optimizer = build_tables()
    resumed.load_sharded_state_dict([saved["sparse"]])
    resumed_optimizer.load_state_dict(saved["optimizer"])
    for step, outputs in zip(range(8, 16), expected):
        got = train(resumed, resumed_optimizer, step_features(step))
        assert all(torch.equal(got[name], outputs[name]) for name in outputs), f"step {step}"
    for name in ("user", "item"):
        assert index_of(resumed, name).statistics() == stats[name]
        assert (index_of(resumed, name).keys == index_of(original, name).keys).all()
    assert all(torch.equal(a, b) for a, b in zip(buffers(resumed).values(), buffers(original).values()))


def test_hash_and_fixed_pieces_do_not_load_into_each_other() -> None:
    hash_collection, _ = build(hash_table(capacity=10))
    fixed_collection = ShardedEmbeddingCollection([EmbeddingTableConfig("t", 10, DIM, ("x",))])
    hash_collection(batch(1, 2))

    with pytest.raises(ShardedStateError, match="'t' is a fixed table, but the checkpoint holds a hash table") as info:
        fixed_collection.load_sharded_state_dict([hash_collection.sharded_state_dict()])
    assert "\n" not in str(info.value)
    with pytest.raises(ShardedStateError, match="'t' is a hash table, but the checkpoint holds a fixed table") as info:
        hash_collection.load_sharded_state_dict([fixed_collection.sharded_state_dict()])
    assert "\n" not in str(info.value)


def test_a_hash_piece_of_another_capacity_does_not_load() -> None:
    small, _ = build(hash_table(capacity=4))
    large, _ = build(hash_table(capacity=8))
    with pytest.raises(ShardedStateError, match=r"capacity x dim \(8, 3\) in the checkpoint, but has \(4, 3\)"):
        large.load_sharded_state_dict([small.sharded_state_dict()])


# Configuration.


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_rows": 0}, "`capacity` of table 't' must be at least 1, but is 0"),
        ({"num_rows": -3}, "`capacity` of table 't' must be at least 1, but is -3"),
        ({"hash_policy": HashPolicy(min_count=0)}, "`min_count` of hash table 't' must be at least 1, but is 0"),
        (
            {"hash_policy": HashPolicy(admit_probability=0.0)},
            r"`admit_probability` of hash table 't' must be in \(0, 1\]",
        ),
        ({"hash_policy": HashPolicy(admit_probability=1.5)}, r"must be in \(0, 1\], but is 1.5"),
        ({"placement": "table_wise"}, "`placement` of hash table 't' must be row_wise"),
        ({"out_of_range": "hash"}, "`out_of_range` of hash table 't' must be error"),
    ],
)
def test_invalid_hash_tables_raise_one_line_config_errors(kwargs: dict[str, Any], message: str) -> None:
    arguments: dict[str, Any] = {"name": "t", "num_rows": 8, "dim": DIM, "features": ("x",), "kind": "hash", **kwargs}
    with pytest.raises(EmbeddingConfigError, match=message) as info:
        EmbeddingTableConfig(**arguments)
    assert "\n" not in str(info.value)


def test_a_row_wise_hash_table_with_a_ttl_is_valid() -> None:
    policy = HashPolicy(min_count=3, admit_probability=1.0, eviction=TtlConfig(ttl_steps=1))
    assert EmbeddingTableConfig("t", 1, DIM, ("x",), kind="hash", hash_policy=policy).hash_policy == policy
    assert EmbeddingTableConfig("t", 8, DIM, ("x",), kind="hash", placement="row_wise").placement == "row_wise"
