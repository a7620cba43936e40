"""Checkpoint pieces of tables stored off the device: the rows that steps have written, by id.

A tiered table's piece is a fixed table's piece (see :mod:`embedding.state`) with ``row_ids``: the
global rows it holds, sorted; every other row of ``[row_start, row_end)`` is at its initial
values with fresh optimizer state, which loading derives again from the piece's ``init_seed``,
``initializer`` and ``init_scale`` (:func:`embedding.state.initial_rows`). So saving a table bigger than
memory writes the rows the run touched, not the table, and such a piece loads into a table on any
tier and any number of ranks as a whole piece would.

Saving writes the cache's changed rows back first; loading forgets the cache and the store's
written rows, then writes the pieces' rows into the store, whence lookups bring them in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from embedding.sharding import ShardGroup
from embedding.state import ShardedStateError, overlapping_pieces, saved_rows_in_range
from embedding.tiers.row_cache import TieredRows


def read_records(tier: TieredRows, rows: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The current values of buffer rows ``rows`` of a tiered group, and their optimizer state (copies)."""
    tier.flush()
    records = torch.from_numpy(tier.store.read(rows.numpy().astype(np.int64)))
    return records[:, : tier.dim].clone(), _split_state(records[:, tier.dim :], tier.state_widths, tier.optimizer_state)


def write_records(
    tier: TieredRows, rows: torch.Tensor, weight: torch.Tensor, state: Mapping[str, torch.Tensor], name: str
) -> None:
    """Write ``weight`` (and ``state``, where given) as buffer rows ``rows`` of a tiered group, after forgetting
    everything it held (a load)."""
    tier.clear()
    buffer_rows = rows.numpy().astype(np.int64)
    records = np.empty((buffer_rows.size, tier.store.width), dtype=np.float32)
    tier.fresh(buffer_rows, records)
    records[:, : tier.dim] = weight.numpy()
    _copy_saved_state(name, records, tier.dim, tier.state_widths, state, torch.arange(buffer_rows.size))
    tier.store.write(buffer_rows, records)


def tiered_group_states(
    group: ShardGroup, delta: Mapping[str, Any] | None = None, whole_above: float = 1.0
) -> dict[str, Any]:
    """The pieces of a tiered group's fixed tables: each table's rows that steps wrote (a copy: the store changes
    as training goes on). With ``delta`` (the keys that mark a delta piece), only those written since the last full
    checkpoint (``RowStore.changed``), unless more than ``whole_above`` of them were."""
    tier = group.tier
    assert tier is not None
    tier.flush()
    store = tier.store
    pieces = {}
    for shard, offset in zip(group.shards, group.buffer_offsets):
        written = np.flatnonzero(store.written[offset : offset + shard.num_rows]).astype(np.int64)
        marks: Mapping[str, Any] = {}
        if delta is not None:
            changed = written[store.changed[written + offset]]
            if changed.size <= whole_above * written.size:
                written, marks = changed, delta
        records = torch.from_numpy(store.read(written + offset))
        pieces[shard.config.name] = {
            "row_start": shard.row_start,
            "row_end": shard.row_end,
            "num_rows": shard.config.num_rows,
            "row_ids": torch.from_numpy(written + shard.row_start),
            "init_seed": tier.fresh.seed,
            "initializer": shard.config.initializer,
            "init_scale": shard.config.initial_scale,
            "weight": records[:, : tier.dim].clone(),
            "optimizer_state": _split_state(records[:, tier.dim :], tier.state_widths, tier.optimizer_state),
            **marks,
        }
    return pieces


def load_tiered_group(group: ShardGroup, pieces: Sequence[Mapping[str, Any]]) -> None:
    """Every row of the group's tables from ``pieces`` (whole or tiered), written into its store."""
    tier = group.tier
    assert tier is not None
    tier.clear()
    store = tier.store
    for shard, offset in zip(group.shards, group.buffer_offsets):
        for saved, start, end in overlapping_pieces(shard, pieces):
            rows, index = saved_rows_in_range(saved, start, end)
            records = np.empty((rows.numel(), store.width), dtype=np.float32)
            buffer_rows = (rows - shard.row_start + offset).numpy()
            tier.fresh(buffer_rows, records)  # the state of a piece saved without an optimizer stays fresh
            records[:, : tier.dim] = saved["weight"][index].float().numpy()  # saved in any dtype
            _copy_saved_state(shard.config.name, records, tier.dim, tier.state_widths, saved["optimizer_state"], index)
            store.write(buffer_rows, records)


def _split_state(
    columns: torch.Tensor, widths: Mapping[str, int], like: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    state, column = {}, 0
    for key, width in widths.items():
        state[key] = columns[:, column : column + width].reshape(-1, *like[key].shape[1:]).clone()
        column += width
    return state


def _copy_saved_state(
    name: str,
    records: np.ndarray,
    dim: int,
    widths: Mapping[str, int],
    saved_state: Mapping[str, torch.Tensor],
    index: torch.Tensor,
) -> None:
    if not saved_state or not widths:
        return
    if saved_state.keys() != widths.keys():
        raise ShardedStateError(
            f"The optimizer state of table '{name}' must have the keys {sorted(widths)} in the checkpoint, but has "
            f"{sorted(saved_state)} instead."
        )
    column = dim
    for key, width in widths.items():
        records[:, column : column + width] = saved_state[key][index].reshape(-1, width).numpy()
        column += width
