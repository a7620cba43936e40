"""Checkpoint pieces of sharded tables: each rank's rows with their global row range.

A rank's piece is ``{"tables": {name: {"row_start", "row_end", "num_rows", "weight",
"optimizer_state": {state name: tensor}}}}``: tensors, ints and strs only, so that
``torch.load(weights_only=True)`` reads it. A table stored off the device saves
only the rows steps have written, listed in ``"row_ids"`` (see :mod:`embedding.tiered_state`).
Loading takes the pieces of every rank of the saving job and copies the rows this rank owns
now, which reshards a checkpoint to any number of ranks or placement. Where the pieces are
written is the checkpoint package's business.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch

from embedding.sharding import TableShard, init_rows
from embedding.table_config import EmbeddingTableConfig


class ShardedStateError(ValueError):
    """Raised when sharded checkpoint pieces do not fit the tables they are loaded into."""


def shard_states(shards: Iterable[TableShard]) -> dict[str, Any]:
    return {
        "tables": {
            shard.config.name: {
                "row_start": shard.row_start,
                "row_end": shard.row_end,
                "num_rows": shard.config.num_rows,
                "weight": shard.weight.detach(),
                "optimizer_state": dict(shard.optimizer_state),
            }
            for shard in shards
        }
    }


def load_shard_states(shards: Iterable[TableShard], pieces: Sequence[Mapping[str, Any]]) -> None:
    """Copy into every shard its rows (and their optimizer state) from ``pieces``.

    Optimizer state is copied where the pieces hold some: a checkpoint saved without an
    optimizer leaves the fresh state of the current one in place.

    :raises ShardedStateError: if a table is missing, has another shape, was saved with
        another optimizer, or if no piece holds some of this rank's rows.
    """
    for shard in shards:
        for saved, start, end in overlapping_pieces(shard, pieces):
            whole = slice(start - shard.row_start, end - shard.row_start)
            if "row_ids" in saved:  # a tiered table's: the rows it does not list are fresh
                shard.weight[whole] = initial_rows(saved, shard.config.name, start, end).to(shard.weight.device)
                for key, tensor in shard.optimizer_state.items():
                    tensor[whole] = shard.state_fill[key]
            rows, source = saved_rows_in_range(saved, start, end)
            target = (rows - shard.row_start).to(shard.weight.device)
            shard.weight[target] = saved["weight"][source].to(shard.weight.device, shard.weight.dtype)
            _copy_optimizer_state(shard, saved["optimizer_state"], target, source)


def dtype_changes(tables: Iterable[EmbeddingTableConfig], pieces: Sequence[Mapping[str, Any]]) -> list[str]:
    """``'name' float32 -> float16`` for each of ``tables`` whose rows ``pieces`` hold in another dtype: a change of a
    table's ``dtype`` between a save and a load, which converts the rows (rounding them to nearest)."""
    changes = []
    for table in tables:
        saved = next((piece["tables"][table.name] for piece in pieces if table.name in piece["tables"]), None)
        if saved is not None and saved["weight"].dtype != table.torch_dtype:
            changes.append(f"'{table.name}' {str(saved['weight'].dtype).removeprefix('torch.')} -> {table.dtype}")
    return changes


def overlapping_pieces(
    shard: TableShard, pieces: Sequence[Mapping[str, Any]]
) -> Iterator[tuple[Mapping[str, Any], int, int]]:
    """Each piece of ``shard``'s table that holds some of its rows, checked, with the global rows ``[start, end)``
    it holds of them.

    :raises ShardedStateError: once every piece is seen, if no piece holds some row of the shard.
    """
    name = shard.config.name
    covered = torch.zeros(shard.num_rows, dtype=torch.bool)
    for piece in pieces:
        saved = piece["tables"].get(name)
        if saved is None:
            continue
        _check_saved_shape(shard, saved)
        start, end = max(shard.row_start, saved["row_start"]), min(shard.row_end, saved["row_end"])
        if start < end:
            yield saved, start, end
            covered[start - shard.row_start : end - shard.row_start] = True
    if not bool(covered.all()):
        missing = shard.row_start + int(torch.nonzero(~covered)[0])
        raise ShardedStateError(
            f"The checkpoint pieces must hold every row of table '{name}', but hold no row {missing} instead."
        )


def initial_rows(saved: Mapping[str, Any], table: str, start: int, end: int) -> torch.Tensor:
    """The initial values of rows ``[start, end)`` of the table a tiered piece is of, as the run that saved it
    started them (from the piece's seed, initializer and scale): the values of the rows it does not list."""
    config = EmbeddingTableConfig(
        table,
        int(saved["num_rows"]),
        int(saved["weight"].size(1)),
        ("_",),
        initializer=saved["initializer"],
        init_scale=float(saved["init_scale"]),
    )
    return init_rows(config, start, end, int(saved["init_seed"]), torch.device("cpu"))


def saved_rows_in_range(saved: Mapping[str, Any], start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global rows in ``[start, end)`` that a piece holds, and where they are in its tensors: all of them in a
    whole piece, the listed ones (``row_ids``) in a tiered table's."""
    if "row_ids" not in saved:
        rows = torch.arange(start, end, dtype=torch.int64)
        return rows, rows - saved["row_start"]
    row_ids = saved["row_ids"]
    index = torch.nonzero((row_ids >= start) & (row_ids < end)).flatten()
    return row_ids[index], index


def _check_saved_shape(shard: TableShard, saved: Mapping[str, Any]) -> None:
    check_whole(shard.config.name, saved)
    if saved.get("kind") == "hash":
        raise ShardedStateError(
            f"Table '{shard.config.name}' is a fixed table, but the checkpoint holds a hash table of that name: "
            "set its kind to hash to load it."
        )
    saved_shape = (saved["num_rows"], saved["weight"].size(1))
    shape = (shard.config.num_rows, shard.config.dim)
    if saved_shape != shape:
        raise ShardedStateError(
            f"Table '{shard.config.name}' must have shape {shape} in the checkpoint, but has {saved_shape} instead."
        )


def _copy_optimizer_state(
    shard: TableShard, saved_state: Mapping[str, torch.Tensor], target: torch.Tensor, source: torch.Tensor
) -> None:
    if not saved_state or not shard.optimizer_state:
        return
    if saved_state.keys() != shard.optimizer_state.keys():
        raise ShardedStateError(
            f"The optimizer state of table '{shard.config.name}' must have the keys "
            f"{sorted(shard.optimizer_state)} in the checkpoint, but has {sorted(saved_state)} instead."
        )
    for key, tensor in shard.optimizer_state.items():
        tensor[target] = saved_state[key][source].to(tensor.device)


def check_whole(name: str, saved: Mapping[str, Any]) -> None:
    """Refuse a delta piece (see :mod:`embedding.row_changes`), which holds only the rows changed over a full one."""
    if "delta_of" in saved:
        raise ShardedStateError(
            f"The piece of table '{name}' must be whole to be loaded, but is a delta over the checkpoint of step "
            f"{saved['delta_of']} instead: merge it over that checkpoint's piece first (``embedding.merge_delta``)."
        )
