"""Resharding of checkpoint pieces, with shards built for any rank count in one process."""

import io

import pytest
import torch

from embedding import EmbeddingTableConfig, ShardedStateError
from embedding.optimizers import init_optimizer_state
from embedding.optimizers.rowwise_adagrad import RowwiseAdagradConfig
from embedding.planner import TableSharding, replicated, row_wise, table_wise
from embedding.sharding import TableShard, build_groups, init_rows
from embedding.state import load_shard_states, shard_states

TABLE = EmbeddingTableConfig("t", num_rows=10, dim=3, features=("x",))
FULL_WEIGHT = torch.arange(30, dtype=torch.float32).view(10, 3)
FULL_SUM = torch.arange(10, dtype=torch.float32)


def shards_of(sharding: TableSharding, world_size: int, filled: bool) -> list[TableShard]:
    shards = []
    for rank in range(world_size):
        (group,) = build_groups([TABLE], {"t": sharding}, world_size, rank, seed=0, device=torch.device("cpu"))
        group.set_optimizer_state(init_optimizer_state(RowwiseAdagradConfig(), group.weight.size(0), 3), {})
        (shard,) = group.shards
        if filled:
            shard.weight.copy_(FULL_WEIGHT[shard.row_start : shard.row_end])
            shard.optimizer_state["sum"].copy_(FULL_SUM[shard.row_start : shard.row_end])
        shards.append(shard)
    return shards


@pytest.mark.parametrize(
    "saved, loaded",
    [
        ((row_wise(10, 2), 2), (row_wise(10, 4), 4)),
        ((row_wise(10, 2), 2), (table_wise(10, 0, 1), 1)),
        ((table_wise(10, 1, 2), 2), (row_wise(10, 3), 3)),
        ((replicated(10, 2), 2), (row_wise(10, 4), 4)),
    ],
)
def test_pieces_of_every_old_rank_reshard_into_new_ranks(
    saved: tuple[TableSharding, int], loaded: tuple[TableSharding, int]
) -> None:
    pieces = [shard_states([shard]) for shard in shards_of(*saved, filled=True)]
    for shard in shards_of(*loaded, filled=False):
        load_shard_states([shard], pieces)
        torch.testing.assert_close(shard.weight, FULL_WEIGHT[shard.row_start : shard.row_end])
        torch.testing.assert_close(shard.optimizer_state["sum"], FULL_SUM[shard.row_start : shard.row_end])


def test_pieces_load_with_weights_only() -> None:
    buffer = io.BytesIO()
    torch.save(shard_states(shards_of(row_wise(10, 1), 1, filled=True)), buffer)
    buffer.seek(0)
    piece = torch.load(buffer, weights_only=True)
    assert piece["tables"]["t"]["row_end"] == 10


def test_missing_rows_and_other_shapes_raise() -> None:
    first_half = shard_states([shards_of(row_wise(10, 2), 2, filled=True)[0]])
    target = shards_of(row_wise(10, 1), 1, filled=False)
    with pytest.raises(ShardedStateError, match="every row of table 't', but hold no row 5"):
        load_shard_states(target, [first_half])

    other = EmbeddingTableConfig("t", num_rows=10, dim=4, features=("x",))
    (group,) = build_groups([other], {"t": row_wise(10, 1)}, 1, 0, 0, torch.device("cpu"))
    piece = shard_states(group.shards)
    with pytest.raises(ShardedStateError, match=r"must have shape \(10, 3\).*\(10, 4\)"):
        load_shard_states(target, [piece])


def test_rows_initialise_the_same_whatever_the_range() -> None:
    table = EmbeddingTableConfig("big", num_rows=70_000, dim=2, features=("x",), init_scale=0.5)
    full = init_rows(table, 0, table.num_rows, seed=1, device=torch.device("cpu"))
    start, end = 65_531, 65_543
    torch.testing.assert_close(init_rows(table, start, end, seed=1, device=torch.device("cpu")), full[start:end])
    assert full.abs().max() <= 0.5
