"""Readers sharded over real gloo processes: each epoch covers every row exactly once, and without
`drop_last` every row, in steps the ranks run in lockstep."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import spawn

from embedding import EmbeddingTableConfig, Placement, ShardedEmbeddingCollection
from gang import FakeGang, ProcessGroupGang
from recipes.cli.job import resolve_job
from recipes.cli.job_spec import JobSpec
from recsys.builtin.dlrm.criteo import SPARSE_FEATURE_NAMES, criteo_schema
from recsys.click.batch import CTRBatch
from recsys.tabular.formats.delimited_text import TabularReader
from recsys.tabular.hashing import hash_value
from recsys.tabular.schema import (
    HISTORY,
    TIME_PARTS,
    CategoricalColumns,
    SplitByValue,
    TabularDataSection,
    resolve_path,
)
from support.gloo_jobs import free_port, gloo_gang

MOVIELENS_TRAIN_ROWS = 80_003  # The ratings before the preset's `split.valid_from`.
NUM_ROWS = 203  # Not a multiple of a global step: the tail is dropped alike on both ranks.


def numbered_line(i: int) -> str:
    """A well-formed Criteo line whose first count ``I1`` is ``i``."""
    cats = [f"{i:08x}"] + [f"{(i * 31 + k) % 4096:08x}" for k in range(25)]
    return "\t".join([str(i % 2), str(i), *([str(i % 7)] * 12), *cats])


def row_numbers(batch: CTRBatch) -> list[int]:
    """The row numbers of a batch of numbered lines: their ``I1``, back through DLRM's ``log(x + 1)``."""
    return torch.expm1(batch.dense[:, 0].double()).round().long().tolist()


def movielens_schema(**changes: Any) -> TabularDataSection:
    """The ``movielens_small`` preset's schema of the shipped ratings (joined genres and tags, derived columns,
    the time split), with ``changes``."""
    shipped = resolve_job(JobSpec("movielens_small")).config.dataset  # type: ignore[attr-defined]
    return dataclasses.replace(shipped, **changes)


SHIPPED_RATINGS = resolve_path("package://recsys.builtin.movielens/ml-latest-small/ratings.csv")


def epoch_rows(reader: TabularReader) -> list[list[int]]:
    """The row numbers of each step, flattened over its micro-batches."""
    return [[i for batch in step for i in row_numbers(batch)] for step in reader]


def worker(rank: int, port: int, criteo_path: str, results: Any) -> None:
    with gloo_gang(rank, 2, port) as gang:
        criteo = TabularReader(
            criteo_path,
            criteo_schema(1 << 20),
            batch_size=8,
            num_accumulate=2,
            dp_rank=gang.rank,
            dp_size=gang.size,
            shuffle_buffer_size=64,
            seed=5,
        )
        first_epoch = epoch_rows(criteo)
        criteo.reset()
        second_epoch = epoch_rows(criteo)

        # Ids from buckets too many to collide: MovieLens holds one rating per (user, movie), so the pair names it.
        ids = CategoricalColumns(columns=["userId", "movieId"], num_buckets=1 << 62)
        schema = movielens_schema(categorical=[ids], dense=[], derived=[], joins=[])
        movielens = TabularReader(
            SHIPPED_RATINGS, schema, split="train", batch_size=256, dp_rank=gang.rank, dp_size=gang.size, seed=5
        )
        pairs = [
            list(zip(batch.sparse["userId"].ids.tolist(), batch.sparse["movieId"].ids.tolist()))
            for step in movielens
            for batch in step
        ]
        results[rank] = gang.all_gather_object((first_epoch, second_epoch, pairs))


def test_two_ranks_read_every_row_once_per_epoch(tmp_path: Path) -> None:
    criteo_path = tmp_path / "day_0.tsv"
    criteo_path.write_text("".join(numbered_line(i) + "\n" for i in range(NUM_ROWS)))
    results = mp.Manager().dict()

    spawn(worker, args=(free_port(), str(criteo_path), results), nprocs=2, join=True)

    gathered = results[0]
    assert gathered == results[1]
    (rank_0, rank_1) = gathered
    for epoch in (0, 1):
        steps_0, steps_1 = rank_0[epoch], rank_1[epoch]
        assert len(steps_0) == len(steps_1) > 0, "both ranks must run the same number of steps"
        rows = [i for step in steps_0 + steps_1 for i in step]
        global_step = 2 * 2 * 8
        assert len(rows) == len(set(rows)) == NUM_ROWS // global_step * global_step
        assert set(rows) <= set(range(NUM_ROWS))
    assert rank_0[0] != rank_0[1], "a new epoch reshuffles"

    pairs_0, pairs_1 = rank_0[2], rank_1[2]
    assert len(pairs_0) == len(pairs_1) > 0, "both ranks must run the same number of steps"
    seen = [pair for batch in pairs_0 + pairs_1 for pair in batch]
    assert len(seen) == MOVIELENS_TRAIN_ROWS // 512 * 512, "every training rating of whole steps is read"
    assert len(seen) == len(set(seen)), "no rating is read twice in an epoch"


KEPT_ROWS = 193  # One row past whole steps on 2 and 3 ranks: the last step reaches rank 0 only.
KEPT_RATINGS = 961  # Likewise for MovieLens' steps of 32 and 48 ratings.
MOVIELENS_BUCKETS = 4096
PLACEMENTS: list[Placement] = ["row_wise", "table_wise", "replicated"]


def lookup_every_batch(gang: ProcessGroupGang, steps: list[list[CTRBatch]], tables: list[EmbeddingTableConfig]) -> None:
    """Runs a sharded lookup of every micro-batch, as validation would: a rank with fewer steps
    or micro-batches than the others would leave them waiting in an all-to-all."""
    collection = ShardedEmbeddingCollection(tables, gang, seed=3)
    reference = ShardedEmbeddingCollection(tables, FakeGang(), seed=3)
    with torch.no_grad():
        for step in steps:
            for batch in step:
                outputs, expected = collection(batch.sparse), reference(batch.sparse)
                for name, output in expected.items():
                    torch.testing.assert_close(outputs[name], output)
                    assert outputs[name].shape == (batch.batch_size, 2)


def keep_last_worker(rank: int, world_size: int, port: int, criteo_path: str, ratings_path: str, results: Any) -> None:
    torch.set_num_threads(1)
    with gloo_gang(rank, world_size, port) as gang:
        criteo = TabularReader(
            criteo_path,
            criteo_schema(4096),  # The rows of the shared table below.
            batch_size=8,
            num_accumulate=2,
            dp_rank=gang.rank,
            dp_size=gang.size,
            shuffle=False,
            shuffle_buffer_size=64,
            drop_last=False,
        )
        criteo_steps = list(criteo)
        shared = EmbeddingTableConfig("shared", 4096, 2, SPARSE_FEATURE_NAMES, placement="row_wise")
        lookup_every_batch(gang, criteo_steps, [shared])

        # The first ratings with the genres and tags that join them: bags on every placement.
        # No split, so neither counts before a row nor histories: the time parts stay.
        shipped = movielens_schema()
        time_parts = [derived for derived in shipped.derived if derived.transform in TIME_PARTS]
        histories = {derived.name for derived in shipped.derived if derived.transform == HISTORY}
        categorical = [group for group in shipped.categorical if not histories & set(group.columns)]
        schema = movielens_schema(split=SplitByValue(), derived=time_parts, dense=[], categorical=categorical)
        for group in schema.categorical:
            group.num_buckets = MOVIELENS_BUCKETS
        movielens = TabularReader(
            ratings_path,
            schema,
            batch_size=16,
            dp_rank=gang.rank,
            dp_size=gang.size,
            shuffle=False,
            drop_last=False,
        )
        movielens_steps = list(movielens)
        tables = [
            EmbeddingTableConfig(name, MOVIELENS_BUCKETS, 2, (name,), placement=placement)
            for name, placement in zip(schema.categorical_columns, PLACEMENTS * 3)
        ]
        lookup_every_batch(gang, movielens_steps, tables)

        results[rank] = gang.all_gather_object(
            (
                [[row_numbers(batch) for batch in step] for step in criteo_steps],
                [
                    [
                        list(zip(batch.sparse["userId"].ids.tolist(), batch.sparse["movieId"].ids.tolist()))
                        for batch in step
                    ]
                    for step in movielens_steps
                ],
            )
        )


def interleave(per_rank: list[list[Any]]) -> list[Any]:
    """The epoch's order back from the ranks' reads: row ``p`` is rank ``p % dp``'s ``p // dp``-th."""
    dp_size = len(per_rank)
    return [per_rank[p % dp_size][p // dp_size] for p in range(sum(len(reads) for reads in per_rank))]


@pytest.mark.parametrize("world_size", [2, 3])
def test_without_drop_last_ranks_read_every_row_in_lockstep_and_in_input_order(tmp_path: Path, world_size: int) -> None:
    criteo_path = tmp_path / "day_0.tsv"
    criteo_path.write_text("".join(numbered_line(i) + "\n" for i in range(KEPT_ROWS)))
    results = mp.Manager().dict()

    ratings_path = tmp_path / "ratings.csv"
    ratings_path.write_text("".join(Path(SHIPPED_RATINGS).read_text().splitlines(keepends=True)[: KEPT_RATINGS + 1]))
    args = (world_size, free_port(), str(criteo_path), str(ratings_path), results)
    spawn(keep_last_worker, args=args, nprocs=world_size)

    per_rank = results[0]
    criteo = [steps for steps, _ in per_rank]
    movielens = [steps for _, steps in per_rank]
    for steps, num_rows in ((criteo, KEPT_ROWS), (movielens, KEPT_RATINGS)):
        # Both read global steps of 16 rows a rank (Criteo: 2 micro-batches of 8).
        assert [len(rank_steps) for rank_steps in steps] == [-(-num_rows // (16 * world_size))] * world_size
        last_step = [[len(batch) for batch in rank_steps[-1]] for rank_steps in steps]
        assert sum(map(sum, last_step)) == 1 and last_step[0][0] == 1, "the last step holds one row, for rank 0"
        assert all(size == 0 for sizes in last_step[1:] for size in sizes), "the other ranks read zero rows"

    def flat(rank_steps: list[list[list[Any]]]) -> list[Any]:
        return [row for step in rank_steps for batch in step for row in batch]

    assert interleave([flat(rank_steps) for rank_steps in criteo]) == list(range(KEPT_ROWS))
    with open(SHIPPED_RATINGS, newline="") as file:
        first_ratings = list(csv.DictReader(file))[:KEPT_RATINGS]
    expected = [
        (hash_value(r["userId"], "userId", MOVIELENS_BUCKETS), hash_value(r["movieId"], "movieId", MOVIELENS_BUCKETS))
        for r in first_ratings
    ]
    assert interleave([flat(rank_steps) for rank_steps in movielens]) == expected
