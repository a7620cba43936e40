"""Tables of float16 and bfloat16 rows in a collection: stored in their dtype, looked up in float32, stepped by the
fused optimizer with rounding keyed by table and global row, saved in their dtype and resumed bit for bit."""

import io

import pytest
import torch
import torch.nn.functional as F

from embedding import (
    EmbeddingConfigError,
    EmbeddingTableConfig,
    ShardedEmbeddingCollection,
    SparseFeatures,
    SparseOptimizer,
    TableStorage,
    init_rows,
)
from embedding.kernels import reference
from embedding.optimizers import sparse_optimizer_config
from support.jagged_ids import jagged

HALF_DTYPES = ["float16", "bfloat16"]


def tables(dtype: str) -> list[EmbeddingTableConfig]:
    """Two tables that share a buffer (same dim and optimizer) and one of float32 rows beside them."""
    return [
        EmbeddingTableConfig("t", num_rows=10, dim=3, features=("a",), dtype=dtype),  # type: ignore[arg-type]
        EmbeddingTableConfig("u", num_rows=7, dim=3, features=("b",), dtype=dtype),  # type: ignore[arg-type]
        EmbeddingTableConfig("v", num_rows=5, dim=3, features=("c",)),
    ]


def batch(seed: int) -> SparseFeatures:
    generator = torch.Generator().manual_seed(seed)

    def feature(num_rows: int) -> object:
        lengths = torch.randint(0, 4, (6,), generator=generator).tolist()
        ids = torch.randint(0, num_rows, (sum(lengths),), generator=generator).tolist()
        return jagged(ids, lengths, torch.rand(len(ids), generator=generator).tolist())

    return SparseFeatures({"a": feature(10), "b": feature(7), "c": feature(5)})  # type: ignore[dict-item]


def train(collection: ShardedEmbeddingCollection, optimizer: SparseOptimizer, seeds: range) -> None:
    for seed in seeds:
        outputs = collection(batch(seed))
        sum((output * torch.linspace(-1.0, 1.0, 3)).sum() for output in outputs.values()).backward()
        optimizer.step()
        optimizer.zero_grad()


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(torch.int16) if tensor.dtype != torch.float32 else tensor.view(torch.int32)


def test_a_dtype_other_than_the_three_is_refused_in_one_line():
    with pytest.raises(EmbeddingConfigError, match=r"^`dtype` of table 't' must be one of float32, float16, bfloat16, "
                       r"but is 'float64' instead.$"):  # fmt: skip
        EmbeddingTableConfig("t", 10, 2, ("x",), dtype="float64")  # type: ignore[arg-type]


def test_a_table_off_the_device_must_keep_float32_rows():
    with pytest.raises(EmbeddingConfigError, match=r"^`dtype` of table 't' must be float32 for a table stored on disk"):
        EmbeddingTableConfig("t", 10, 2, ("x",), storage=TableStorage("disk"), dtype="bfloat16")


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_rows_are_stored_in_the_dtype_and_counted_in_its_bytes(dtype):
    collection = ShardedEmbeddingCollection(tables(dtype), seed=3)

    shard = collection.shards["t"]
    assert shard.weight.dtype == getattr(torch, dtype)
    assert collection.shards["v"].weight.dtype == torch.float32
    assert len(collection.groups) == 2  # the float32 table in a buffer of its own
    assert torch.equal(shard.weight, init_rows(shard.config, 0, 10, 3, torch.device("cpu")).to(shard.weight.dtype))
    assert shard.config.num_bytes == 10 * 3 * 2
    assert collection.memory_bytes == (10 + 7) * 3 * 2 + 5 * 3 * 4
    # With their optimizer state (row-wise Adagrad's: one float32 a row), as the start-up report and check count.
    assert [need.near for need in collection.tier_needs] == [10 * (3 * 2 + 4), 7 * (3 * 2 + 4), 5 * (3 * 4 + 4)]


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_lookups_pool_the_rows_in_float32(dtype):
    collection = ShardedEmbeddingCollection(tables(dtype), seed=1)
    features = batch(0)

    outputs = collection(features)

    widened = collection.shards["t"].weight.float()
    feature = features["a"]
    expected = F.embedding_bag(
        feature.ids, widened, feature.offsets, mode="sum", per_sample_weights=feature.weights, include_last_offset=True
    )
    assert outputs["a"].dtype == torch.float32
    torch.testing.assert_close(outputs["a"], expected, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["sgd", "rowwise_adagrad", "adagrad", "adam", "adamw"])
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_a_step_is_the_references_keyed_by_each_tables_rows(name, dtype):
    """The optimizer's step equals the reference's on the same gradient with the group's keys: each table's rows
    keyed by its name and global row; the optimizer state float32."""
    config = sparse_optimizer_config(name, lr=0.1, weight_decay=0.01)
    collection = ShardedEmbeddingCollection(tables(dtype), seed=2)
    optimizer = SparseOptimizer(collection, config)
    group = collection.groups[0]
    weight, state = group.weight.clone(), {key: tensor.clone() for key, tensor in group.optimizer_state.items()}

    outputs = collection(batch(4))
    sum((output * torch.linspace(-1.0, 1.0, 3)).sum() for output in outputs.values()).backward()
    grads = group.accumulated_grads()
    assert grads is not None
    reference.fused_step(
        config, weight, state, grads.ids, grads.grad_rows, grads.grad_index, grads.grad_scale, 1,
        row_keys=group.row_keys(),
    )  # fmt: skip
    optimizer.step()

    assert torch.equal(bits(group.weight), bits(weight))
    assert all(tensor.dtype == torch.float32 for tensor in group.optimizer_state.values())


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_a_resumed_collection_trains_on_bit_for_bit(dtype):
    config = sparse_optimizer_config("rowwise_adagrad", lr=0.3)
    straight = ShardedEmbeddingCollection(tables(dtype), seed=5)
    straight_optimizer = SparseOptimizer(straight, config)
    train(straight, straight_optimizer, range(3))
    buffer = io.BytesIO()
    torch.save({"sparse": straight.sharded_state_dict(), "optimizer": straight_optimizer.state_dict()}, buffer)
    train(straight, straight_optimizer, range(3, 6))

    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    assert saved["sparse"]["tables"]["t"]["weight"].dtype == getattr(torch, dtype)
    resumed = ShardedEmbeddingCollection(tables(dtype), seed=5)
    resumed_optimizer = SparseOptimizer(resumed, config)
    resumed.load_sharded_state_dict([saved["sparse"]])
    resumed_optimizer.load_state_dict(saved["optimizer"])
    train(resumed, resumed_optimizer, range(3, 6))

    for name, shard in straight.shards.items():
        assert torch.equal(bits(resumed.shards[name].weight), bits(shard.weight))
        for key, tensor in shard.optimizer_state.items():
            assert torch.equal(resumed.shards[name].optimizer_state[key], tensor)


@pytest.mark.parametrize(
    ("saved", "loaded"), [("float32", "float16"), ("bfloat16", "float32"), ("float16", "bfloat16")]
)
def test_rows_saved_in_another_dtype_are_converted_and_the_load_says_so(saved, loaded, caplog):
    source = ShardedEmbeddingCollection(tables(saved), seed=6)
    SparseOptimizer(source, sparse_optimizer_config("adam"))
    target = ShardedEmbeddingCollection(tables(loaded), seed=7)
    SparseOptimizer(target, sparse_optimizer_config("adam"))

    with caplog.at_level("INFO", logger="embedding.collection"):
        target.load_sharded_state_dict([source.sharded_state_dict()])

    for name in ("t", "u"):
        assert target.shards[name].weight.dtype == getattr(torch, loaded)
        assert torch.equal(target.shards[name].weight, source.shards[name].weight.to(getattr(torch, loaded)))
    assert torch.equal(target.shards["v"].weight, source.shards["v"].weight)
    (record,) = caplog.records
    assert record.getMessage() == (
        "The checkpoint's rows are loaded into tables of another dtype, converted: "
        f"'t' {saved} -> {loaded}, 'u' {saved} -> {loaded}."
    )


def test_rows_in_their_own_dtype_load_without_a_word(caplog):
    source, target = (
        ShardedEmbeddingCollection(tables("float16"), seed=6),
        ShardedEmbeddingCollection(tables("float16")),
    )

    with caplog.at_level("INFO", logger="embedding.collection"):
        target.load_sharded_state_dict([source.sharded_state_dict()])

    assert torch.equal(bits(target.shards["t"].weight), bits(source.shards["t"].weight))
    assert caplog.records == []


def hash_table(capacity: int, dtype: str) -> EmbeddingTableConfig:
    return EmbeddingTableConfig("h", capacity, 4, ("x",), kind="hash", dtype=dtype)  # type: ignore[arg-type]


def id_batch(seed: int) -> SparseFeatures:
    generator = torch.Generator().manual_seed(seed)
    ids = (torch.randint(0, 12, (20,), generator=generator) * 1_000_003 - 7).tolist()  # large ids, some negative
    return SparseFeatures({"x": jagged(ids, [4] * 5, torch.rand(20, generator=generator).tolist())})


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_a_hash_tables_rows_round_by_their_id_whichever_slot_holds_it(dtype):
    """Ids given their slots in another order (as another number of ranks would) end with the same bits."""
    config = sparse_optimizer_config("adagrad", lr=0.2)
    ids = torch.unique(torch.cat([id_batch(seed)["x"].ids for seed in range(4)]))
    runs = []
    for order in (ids, ids.flip(0)):
        collection = ShardedEmbeddingCollection([hash_table(16, dtype)], seed=4)
        optimizer = SparseOptimizer(collection, config)
        (group,) = collection.groups
        assert group.dynamic is not None
        for half in order.chunk(2):  # a step's new ids take slots in the order of their ids
            group.dynamic.rows(half, group.weight, group.optimizer_state, training=True)
        for seed in range(4):
            outputs = collection(id_batch(seed))
            (outputs["x"] * torch.linspace(-1.0, 1.0, 4)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
        runs.append(collection)

    rows = []
    for collection in runs:
        shard = collection.shards["h"]
        assert shard.dynamic is not None and shard.weight.dtype == getattr(torch, dtype)
        slots, _ = shard.dynamic.look_up(ids, training=False)
        assert bool((slots >= 0).all())
        rows.append(shard.weight[slots])
    assert not torch.equal(*[shard_slots(c, ids) for c in runs])
    assert torch.equal(bits(rows[0]), bits(rows[1]))


def shard_slots(collection: ShardedEmbeddingCollection, ids: torch.Tensor) -> torch.Tensor:
    dynamic = collection.shards["h"].dynamic
    assert dynamic is not None
    return dynamic.look_up(ids, training=False)[0]


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_a_resumed_hash_table_trains_on_bit_for_bit(dtype):
    config = sparse_optimizer_config("rowwise_adagrad", lr=0.3)

    def run(steps: range, collection: ShardedEmbeddingCollection, optimizer: SparseOptimizer) -> None:
        for seed in steps:
            (collection(id_batch(seed))["x"] * torch.linspace(-1.0, 1.0, 4)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()

    straight = ShardedEmbeddingCollection([hash_table(24, dtype)], seed=2)
    straight_optimizer = SparseOptimizer(straight, config)
    run(range(2), straight, straight_optimizer)
    buffer = io.BytesIO()
    torch.save({"sparse": straight.sharded_state_dict(), "optimizer": straight_optimizer.state_dict()}, buffer)
    run(range(2, 5), straight, straight_optimizer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    resumed = ShardedEmbeddingCollection([hash_table(24, dtype)], seed=2)
    resumed_optimizer = SparseOptimizer(resumed, config)
    resumed.load_sharded_state_dict([saved["sparse"]])
    resumed_optimizer.load_state_dict(saved["optimizer"])
    run(range(2, 5), resumed, resumed_optimizer)

    assert saved["sparse"]["tables"]["h"]["weight"].dtype == getattr(torch, dtype)
    assert torch.equal(bits(resumed.shards["h"].weight), bits(straight.shards["h"].weight))
