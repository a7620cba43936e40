"""Readers sharded over two real gloo processes: each epoch covers every row exactly once."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gang import ProcessGroupGang
from recipes.builtin.dlrm.criteo import CriteoReader
from recipes.builtin.movielens.reader import MovieLensReader, load_movielens
from recipes.builtin.movielens.recipe import SHIPPED_DATA

pytestmark = pytest.mark.slow

NO_FOLDING = 1 << 32
NUM_ROWS = 203  # Not a multiple of a global step: the tail is dropped alike on both ranks.


def numbered_line(i: int) -> str:
    """A well-formed Criteo line whose cat_0 hash is ``i``."""
    cats = [f"{i:08x}"] + [f"{(i * 31 + k) % 4096:08x}" for k in range(25)]
    return "\t".join([str(i % 2), *([str(i % 7)] * 13), *cats])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def epoch_ids(reader: Any, feature: str) -> list[list[int]]:
    """The ids of ``feature`` of each step, flattened over its micro-batches."""
    return [[i for batch in step for i in batch.sparse[feature].ids.tolist()] for step in reader]


def worker(rank: int, port: int, criteo_path: str, results: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    gang = ProcessGroupGang(dist.group.WORLD, torch.device("cpu"))  # type: ignore[arg-type]
    try:
        criteo = CriteoReader(
            criteo_path,
            batch_size=8,
            num_accumulate=2,
            num_embeddings_per_feature=NO_FOLDING,
            dp_rank=gang.rank,
            dp_size=gang.size,
            shuffle_buffer_size=64,
            seed=5,
        )
        first_epoch = epoch_ids(criteo, "cat_0")
        criteo.reset()
        second_epoch = epoch_ids(criteo, "cat_0")

        data = load_movielens(SHIPPED_DATA)
        train_rows, _ = data.split("random", 0.2, seed=1)
        movielens = MovieLensReader(data, train_rows, batch_size=256, dp_rank=gang.rank, dp_size=gang.size, seed=5)
        # MovieLens holds one rating per (user, movie), so the pair names the rating.
        pairs = [
            list(zip(batch.sparse["user"].ids.tolist(), batch.sparse["movie"].ids.tolist()))
            for step in movielens
            for batch in step
        ]
        results[rank] = gang.all_gather_object((first_epoch, second_epoch, pairs, movielens.num_steps_per_epoch))
    finally:
        dist.barrier()  # No rank tears down gloo while a peer still talks to it.
        dist.destroy_process_group()


def test_two_ranks_read_every_row_once_per_epoch(tmp_path: Path) -> None:
    criteo_path = tmp_path / "day_0.tsv"
    criteo_path.write_text("".join(numbered_line(i) + "\n" for i in range(NUM_ROWS)))
    results = mp.Manager().dict()

    mp.spawn(worker, args=(free_port(), str(criteo_path), results), nprocs=2, join=True)

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
    assert rank_0[3] == rank_1[3] == len(pairs_0) == len(pairs_1)
    seen = [pair for batch in pairs_0 + pairs_1 for pair in batch]
    assert len(seen) == len(set(seen)), "no rating is read twice in an epoch"
