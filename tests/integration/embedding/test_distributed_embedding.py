"""Sharded collections over real gloo processes equal one process looking up the whole batch.

Two spawned jobs share the checks: 2 ranks (table-wise, row-wise, replicated lookups, two update
steps, saving) and 4 ranks (loading the 2-rank pieces into other placements, one more step). A
third, on 2 ranks, gives one rank the whole batch and the other none, as the short last step of
a reader that keeps every row does. A fourth sends each step's ids ahead on a second process
group, from another thread, as the train pipeline does, and must change no bit.
"""

import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from embedding import (
    EmbeddingTableConfig,
    HashPolicy,
    JaggedIds,
    Placement,
    ShardedEmbeddingCollection,
    SparseFeatures,
    SparseOptimizer,
)
from embedding.optimizers.adagrad import AdagradConfig
from embedding.optimizers.adam import AdamConfig
from embedding.optimizers.rowwise_adagrad import RowwiseAdagradConfig
from gang import FakeGang, Gang
from support.gloo_jobs import free_port, gloo_gang, start_ranks

GLOBAL_BATCH = 8
DIM = 4
TABLES = [
    EmbeddingTableConfig("user", 13, DIM, ("u",), placement="row_wise"),
    EmbeddingTableConfig("item", 11, DIM, ("i1", "i2"), pooling="mean", placement="table_wise", optimizer=AdamConfig()),
    EmbeddingTableConfig("cat", 5, DIM, ("c",), placement="replicated", optimizer=AdagradConfig()),
    EmbeddingTableConfig("hist", 9, DIM + 2, ("h",), pooling="none", placement="row_wise"),  # rows of two widths
]
OPTIMIZER = RowwiseAdagradConfig(lr=0.5)
UNPOOLED_FEATURES = {name for table in TABLES if table.pooling == "none" for name in table.features}
PLACEMENTS: list[Placement] = ["table_wise", "row_wise", "replicated"]


def global_batch(step: int) -> tuple[SparseFeatures, dict[str, torch.Tensor]]:
    """The features of every sample and, per feature, a loss coefficient per output row."""
    generator = torch.Generator().manual_seed(step)
    features, coefficients = {}, {}
    for table in TABLES:
        for name in table.features:
            lengths = torch.randint(0, 4, (GLOBAL_BATCH,), generator=generator)
            ids = torch.randint(0, table.num_rows, (int(lengths.sum()),), generator=generator)
            weights = torch.rand(ids.numel(), generator=generator) if name == "u" else None
            features[name] = JaggedIds(ids, torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]), weights)
            rows = ids.numel() if table.pooling == "none" else GLOBAL_BATCH
            coefficients[name] = torch.randn(rows, table.dim, generator=generator)
    return SparseFeatures(features), coefficients


def rank_batch(step: int, rank: int, world_size: int) -> tuple[SparseFeatures, dict[str, torch.Tensor]]:
    """This rank's contiguous share of the samples of ``global_batch(step)``."""
    features, coefficients = global_batch(step)
    per_rank = GLOBAL_BATCH // world_size
    first, last = rank * per_rank, (rank + 1) * per_rank
    local, local_coefficients = {}, {}
    for name, jagged in features.items():
        start, end = int(jagged.offsets[first]), int(jagged.offsets[last])
        weights = None if jagged.weights is None else jagged.weights[start:end]
        local[name] = JaggedIds(jagged.ids[start:end], jagged.offsets[first : last + 1] - start, weights)
        rows = slice(start, end) if name in UNPOOLED_FEATURES else slice(first, last)
        local_coefficients[name] = coefficients[name][rows]
    return SparseFeatures(local), local_coefficients


def no_samples(features: SparseFeatures) -> SparseFeatures:
    """Features of the same names and types as ``features`` for a batch of zero samples."""
    return SparseFeatures(
        {
            name: JaggedIds(
                jagged.ids[:0],
                jagged.offsets[:1] - jagged.offsets[0],
                None if jagged.weights is None else jagged.weights[:0],
            )
            for name, jagged in features.items()
        }
    )


def train_step(
    collection: ShardedEmbeddingCollection, optimizer: SparseOptimizer, step: int, rank: int, world_size: int
) -> dict[str, torch.Tensor]:
    return apply_step(collection, optimizer, *rank_batch(step, rank, world_size))


def apply_step(
    collection: ShardedEmbeddingCollection,
    optimizer: SparseOptimizer,
    features: SparseFeatures,
    coefficients: dict[str, torch.Tensor],
) -> dict[str, torch.Tensor]:
    """One step of a linear loss with the given coefficients; the outputs the step looked up."""
    outputs = collection(features)
    sum((outputs[name] * coefficients[name]).sum() for name in outputs).backward()
    optimizer.step()
    optimizer.zero_grad()
    return {name: output.detach() for name, output in outputs.items()}


def build(gang: Gang, tables: list[EmbeddingTableConfig]) -> tuple[ShardedEmbeddingCollection, SparseOptimizer]:
    collection = ShardedEmbeddingCollection(tables, gang, seed=7)
    return collection, SparseOptimizer(collection, OPTIMIZER, backend="reference")


def run_2_ranks(gang: Gang, out: Path) -> None:
    collection, optimizer = build(gang, TABLES)
    outputs = [train_step(collection, optimizer, step, gang.rank, gang.size) for step in (1, 2)]
    saved = {"outputs": outputs, "sparse": collection.sharded_state_dict(), "optimizer": optimizer.state_dict()}
    torch.save(saved, out / f"2_ranks_{gang.rank}.pt")


def run_4_ranks(gang: Gang, out: Path) -> None:
    # Other placements than the saving job: everything row-wise.
    collection, optimizer = build(gang, [replace(table, placement="row_wise") for table in TABLES])
    pieces = [torch.load(out / f"2_ranks_{rank}.pt", weights_only=True) for rank in range(2)]
    collection.load_sharded_state_dict([piece["sparse"] for piece in pieces])
    optimizer.load_state_dict(pieces[0]["optimizer"])
    # Saved now: the pieces share storage with the shards, which the next step updates.
    torch.save(collection.sharded_state_dict(), out / f"4_ranks_loaded_{gang.rank}.pt")
    outputs = train_step(collection, optimizer, 3, gang.rank, gang.size)
    torch.save({"outputs": outputs, "sparse": collection.sharded_state_dict()}, out / f"4_ranks_{gang.rank}.pt")


def run_empty_batch(gang: Gang, out: Path) -> None:
    """Per placement: step 1's batch looked up by each rank in turn while the other has none
    (no grad, as validation does), then one update step with rank 1's batch empty."""
    features, coefficients = global_batch(1)
    saved: dict[str, Any] = {}
    for placement in PLACEMENTS:
        collection, optimizer = build(gang, [replace(table, placement=placement) for table in TABLES])
        for full_rank in range(gang.size):
            with torch.no_grad():
                outputs = collection(features if gang.rank == full_rank else no_samples(features))
            saved[f"{placement}/looked_up_by_{full_rank}"] = outputs
        mine = features if gang.rank == 0 else no_samples(features)
        outputs = collection(mine)
        sum((outputs[name] * coefficients[name][: outputs[name].size(0)]).sum() for name in outputs).backward()
        optimizer.step()
        saved[f"{placement}/sparse"] = collection.sharded_state_dict()
    torch.save(saved, out / f"empty_batch_{gang.rank}.pt")


def run_prefetched(gang: Gang, out: Path) -> None:
    """Three steps of every placement, plain and with each step's ids sent ahead on another thread and group
    while the plain collection computes (the step before, in a pipeline)."""
    id_gang = gang.make_gang(list(range(gang.size)))
    assert id_gang is not None
    hashed = EmbeddingTableConfig("hashed", 6, DIM, ("x",), kind="hash", hash_policy=HashPolicy(min_count=2))
    tables = [*TABLES, hashed]
    plain, plain_optimizer = build(gang, tables)
    piped, piped_optimizer = build(gang, tables)
    saved: dict[str, Any] = {}
    for step in (1, 2, 3):
        features, coefficients = rank_batch(step, gang.rank, gang.size)
        features = SparseFeatures({**features, "x": features["u"]})
        coefficients["x"] = coefficients["u"]
        prepared: list[SparseFeatures] = []
        sender = threading.Thread(target=_prepare_into, args=(prepared, piped, features, id_gang))
        sender.start()
        saved[f"plain/{step}"] = apply_step(plain, plain_optimizer, features, coefficients)
        sender.join()
        saved[f"piped/{step}"] = apply_step(piped, piped_optimizer, prepared[0], coefficients)
        saved[f"used/{step}"] = prepared[0].prepared_for(piped).used  # type: ignore[union-attr]
    saved["plain/sparse"], saved["piped/sparse"] = plain.sharded_state_dict(), piped.sharded_state_dict()
    torch.save(saved, out / f"prefetched_{gang.rank}.pt")


def _prepare_into(
    prepared: list[SparseFeatures], collection: ShardedEmbeddingCollection, features: SparseFeatures, gang: Gang
) -> None:
    prepared.append(collection.prepare_ahead(features, gang))


JOBS = {"2_ranks": run_2_ranks, "4_ranks": run_4_ranks, "empty_batch": run_empty_batch, "prefetched": run_prefetched}


def _worker(rank: int, world_size: int, port: int, job: str, out: Path) -> None:
    torch.set_num_threads(1)
    with gloo_gang(rank, world_size, port) as gang:
        JOBS[job](gang, out)


def start_job(world_size: int, job: str, out: Path) -> None:
    start_ranks(_worker, (world_size, free_port(), job, out), world_size)


def single_process_reference(steps: int) -> tuple[ShardedEmbeddingCollection, list[dict[str, torch.Tensor]]]:
    collection, optimizer = build(FakeGang(), TABLES)
    return collection, [train_step(collection, optimizer, step, 0, 1) for step in range(1, steps + 1)]


def assemble(pieces: list[dict[str, Any]]) -> ShardedEmbeddingCollection:
    """The tables of a job, loaded from its pieces into one process."""
    collection, _ = build(FakeGang(), TABLES)
    collection.load_sharded_state_dict(pieces)
    return collection


def assert_same_tables(actual: ShardedEmbeddingCollection, expected: ShardedEmbeddingCollection) -> None:
    for name, shard in expected.shards.items():
        torch.testing.assert_close(actual.shards[name].weight, shard.weight, msg=f"table {name}")
        for key, state in shard.optimizer_state.items():
            torch.testing.assert_close(actual.shards[name].optimizer_state[key], state, msg=f"{name} {key}")


def assert_same_outputs(rank_outputs: list[dict[str, torch.Tensor]], expected: dict[str, torch.Tensor]) -> None:
    for name, output in expected.items():
        torch.testing.assert_close(torch.cat([outputs[name] for outputs in rank_outputs]), output, msg=name)


def test_sharded_lookups_steps_and_resharding_equal_one_process(tmp_path: Path) -> None:
    start_job(2, "2_ranks", tmp_path)
    two = [torch.load(tmp_path / f"2_ranks_{rank}.pt", weights_only=True) for rank in range(2)]
    reference, reference_outputs = single_process_reference(steps=3)
    for step in (0, 1):
        assert_same_outputs([saved["outputs"][step] for saved in two], reference_outputs[step])

    # The reference after two steps: saved on 2 ranks, loaded into 1.
    after_two, _ = single_process_reference(steps=2)
    assert_same_tables(assemble([saved["sparse"] for saved in two]), after_two)

    start_job(4, "4_ranks", tmp_path)
    four = [torch.load(tmp_path / f"4_ranks_{rank}.pt", weights_only=True) for rank in range(4)]
    loaded = [torch.load(tmp_path / f"4_ranks_loaded_{rank}.pt", weights_only=True) for rank in range(4)]
    assert_same_tables(assemble(loaded), after_two)
    assert_same_outputs([saved["outputs"] for saved in four], reference_outputs[2])
    assert_same_tables(assemble([saved["sparse"] for saved in four]), reference)


def test_a_rank_with_no_sample_looks_up_beside_one_with_the_whole_batch(tmp_path: Path) -> None:
    start_job(2, "empty_batch", tmp_path)
    saved = [torch.load(tmp_path / f"empty_batch_{rank}.pt", weights_only=True) for rank in range(2)]
    reference, [expected] = single_process_reference(steps=1)

    for placement in PLACEMENTS:
        for full_rank in range(2):
            outputs = [rank_saved[f"{placement}/looked_up_by_{full_rank}"] for rank_saved in saved]
            for name, output in expected.items():
                torch.testing.assert_close(outputs[full_rank][name], output, msg=f"{placement} {name}")
                assert outputs[1 - full_rank][name].shape == (0, output.size(1)), f"{placement} {name}"
        # The update of a step whose samples are all on rank 0 is the update of one process.
        assert_same_tables(assemble([rank_saved[f"{placement}/sparse"] for rank_saved in saved]), reference)


def test_ids_sent_ahead_on_another_group_change_no_bit(tmp_path: Path) -> None:
    start_job(2, "prefetched", tmp_path)
    for rank in range(2):
        saved = torch.load(tmp_path / f"prefetched_{rank}.pt", weights_only=True)
        for step in (1, 2, 3):
            assert saved[f"used/{step}"], "the forward used what was sent ahead"
            for name, output in saved[f"plain/{step}"].items():
                assert torch.equal(saved[f"piped/{step}"][name], output), f"step {step} {name}"
        assert_bitwise_equal(saved["piped/sparse"], saved["plain/sparse"], "tables")


def assert_bitwise_equal(actual: Any, expected: Any, where: str) -> None:
    if isinstance(expected, dict):
        assert actual.keys() == expected.keys(), where
        for key in expected:
            assert_bitwise_equal(actual[key], expected[key], f"{where}/{key}")
    elif torch.is_tensor(expected):
        assert torch.equal(actual, expected), where
    else:
        assert (actual == expected).all() if hasattr(expected, "all") else actual == expected, where
