"""Hash tables over real gloo processes: ids travel to the rank their hash names, and the result is
one process's, id for id; 2-rank checkpoints load into 1 and 3 ranks and go on training."""

from pathlib import Path
from typing import Any

import torch

from embedding import (
    EmbeddingTableConfig,
    HashPolicy,
    JaggedIds,
    ShardedEmbeddingCollection,
    SparseFeatures,
    SparseOptimizer,
)
from embedding.optimizers.adam import AdamConfig
from embedding.optimizers.rowwise_adagrad import RowwiseAdagradConfig
from gang import FakeGang, Gang
from integration.embedding.test_distributed_embedding import apply_step
from support.gloo_jobs import free_port, gloo_gang, start_ranks

GLOBAL_BATCH = 12
DIM = 4
TABLES = [
    # Room for every id: no eviction, so slots are the only difference between layouts.
    EmbeddingTableConfig("user", 600, DIM, ("u",), kind="hash", hash_policy=HashPolicy(min_count=2)),
    EmbeddingTableConfig("item", 600, DIM, ("i",), pooling="mean", kind="hash", optimizer=AdamConfig()),
]


def rank_batch(step: int, rank: int, world_size: int) -> tuple[SparseFeatures, dict[str, torch.Tensor]]:
    """This rank's share of step ``step``'s samples: ids anywhere in the int64 range, repeated often."""
    generator = torch.Generator().manual_seed(step)
    vocabulary = torch.randint(-(2**62), 2**62, (40,), generator=generator.manual_seed(0))
    generator.manual_seed(step)
    per_rank = GLOBAL_BATCH // world_size
    features, coefficients = {}, {}
    for name in ("u", "i"):
        lengths = torch.randint(0, 4, (GLOBAL_BATCH,), generator=generator)
        ids = vocabulary[torch.randint(0, 40, (int(lengths.sum()),), generator=generator)]
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        grads = torch.randn(GLOBAL_BATCH, DIM, generator=generator)
        first, last = rank * per_rank, (rank + 1) * per_rank
        start, end = int(offsets[first]), int(offsets[last])
        features[name] = JaggedIds(ids[start:end], offsets[first : last + 1] - start)
        coefficients[name] = grads[first:last]
    return SparseFeatures(features), coefficients


def build(gang: Gang) -> tuple[ShardedEmbeddingCollection, SparseOptimizer]:
    collection = ShardedEmbeddingCollection(TABLES, gang, seed=3)
    return collection, SparseOptimizer(collection, RowwiseAdagradConfig(lr=0.5))


def train_step(
    collection: ShardedEmbeddingCollection, optimizer: SparseOptimizer, step: int, rank: int, world_size: int
) -> dict[str, torch.Tensor]:
    return apply_step(collection, optimizer, *rank_batch(step, rank, world_size))


def run_2_ranks(gang: Gang, out: Path) -> None:
    collection, optimizer = build(gang)
    outputs = [train_step(collection, optimizer, step, gang.rank, gang.size) for step in (1, 2, 3)]
    saved = {"outputs": outputs, "sparse": collection.sharded_state_dict(), "optimizer": optimizer.state_dict()}
    torch.save(saved, out / f"2_ranks_{gang.rank}.pt")


def run_3_ranks(gang: Gang, out: Path) -> None:
    collection, optimizer = build(gang)
    pieces = [torch.load(out / f"2_ranks_{rank}.pt", weights_only=True) for rank in range(2)]
    collection.load_sharded_state_dict([piece["sparse"] for piece in pieces])
    optimizer.load_state_dict(pieces[0]["optimizer"])
    outputs = train_step(collection, optimizer, 4, gang.rank, gang.size)
    torch.save({"outputs": outputs, "sparse": collection.sharded_state_dict()}, out / f"3_ranks_{gang.rank}.pt")


JOBS = {"2_ranks": run_2_ranks, "3_ranks": run_3_ranks}


def _worker(rank: int, world_size: int, port: int, job: str, out: Path) -> None:
    torch.set_num_threads(1)
    with gloo_gang(rank, world_size, port) as gang:
        JOBS[job](gang, out)


def start_job(world_size: int, job: str, out: Path) -> None:
    start_ranks(_worker, (world_size, free_port(), job, out), world_size)


def rows_by_id(pieces: list[dict[str, Any]], table: str) -> dict[int, torch.Tensor]:
    """Every id's row (and optimizer state) in the pieces of a job, whatever slot it sits in."""
    rows = {}
    for piece in pieces:
        saved = piece["tables"][table]
        for i, key in enumerate(saved["index"]["keys"].tolist()):
            state = [tensor[i].reshape(-1) for _, tensor in sorted(saved["optimizer_state"].items())]
            rows[key] = torch.cat([saved["weight"][i], *state])
    return rows


def assert_same_rows(actual: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    for table in ("user", "item"):
        got, want = rows_by_id(actual, table), rows_by_id(expected, table)
        assert got.keys() == want.keys(), table
        for key, row in want.items():
            torch.testing.assert_close(got[key], row, msg=f"{table} id {key}")


def test_hash_tables_on_2_and_3_ranks_equal_one_process_and_reshard(tmp_path: Path) -> None:
    start_job(2, "2_ranks", tmp_path)
    two = [torch.load(tmp_path / f"2_ranks_{rank}.pt", weights_only=True) for rank in range(2)]
    reference, optimizer = build(FakeGang())
    for step in (1, 2, 3):
        expected = train_step(reference, optimizer, step, 0, 1)
        for name, output in expected.items():
            torch.testing.assert_close(torch.cat([saved["outputs"][step - 1][name] for saved in two]), output)
    assert_same_rows([saved["sparse"] for saved in two], [reference.sharded_state_dict()])
    stats = reference.groups[0].dynamic.statistics()  # type: ignore[union-attr]
    assert 0 < stats["admitted"] < 40 and stats["rejected"] > 0  # min_count=2 held some ids back

    # 2 ranks -> 1 process: the same rows, and the next step as the reference's.
    one, one_optimizer = build(FakeGang())
    one.load_sharded_state_dict([saved["sparse"] for saved in two])
    one_optimizer.load_state_dict(two[0]["optimizer"])
    assert_same_rows([one.sharded_state_dict()], [reference.sharded_state_dict()])
    expected = train_step(reference, optimizer, 4, 0, 1)
    for name, output in train_step(one, one_optimizer, 4, 0, 1).items():
        torch.testing.assert_close(output, expected[name])

    # 2 ranks -> 3 ranks: ids re-hashed to their new owners, the same step 4.
    start_job(3, "3_ranks", tmp_path)
    three = [torch.load(tmp_path / f"3_ranks_{rank}.pt", weights_only=True) for rank in range(3)]
    assert_same_rows([saved["sparse"] for saved in three], [reference.sharded_state_dict()])
