"""Which rows of a collection's tables changed since its last full checkpoint, and checkpoint pieces of those rows.

A checkpoint of a big table that writes every row costs the table's bytes each time, while a step
changes only the rows its batch looks up: under a skewed id distribution, a small share of the table
between two checkpoints. So each group on the device keeps a bool per buffer row, set by the sparse
optimizer's step for the rows it updates and, in a hash table, for a slot given to a new id. A *delta*
piece holds those rows only, with ``"delta_of"``: the step of the full checkpoint it lies over;
:func:`merge_delta` puts such a piece over that checkpoint's piece of the same table and rank, which gives
the full piece bit for bit. Deltas are cumulative (every row changed since the full one), so a
checkpoint needs its base alone, never a chain of deltas; a table most of whose rows changed is saved whole
(``WHOLE_ABOVE``).

A fixed table's delta is the subset format of :mod:`embedding.state` (``row_ids``, sorted global rows)
with ``delta_of`` in place of ``init_seed``. A hash table's delta holds its whole index (ids, slots,
counters: a few ints per used slot) and, at ``changed``, the positions of the index's entries whose rows
it holds. A table stored off the device (a storage tier) saves the rows steps have written (see
:mod:`embedding.tiered_state`); its delta, those written to its store since the full checkpoint, which
:func:`merge_delta` unites with the base's.

Loading any piece marks every row changed: the rows no longer follow the last full checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from embedding.dynamic_state import hash_shard_state
from embedding.sharding import ShardGroup
from embedding.state import ShardedStateError, shard_states
from embedding.tiered_state import tiered_group_states

DELTA_KEY = "delta_of"
"""The key of a delta piece that names the step of the full checkpoint it lies over."""

WHOLE_ABOVE = 0.5
"""The share of a table's rows changed above which its delta piece is the whole piece instead: hardly smaller,
as each row of a delta carries its id too, and slower to gather than the table's rows as they lie."""


def changed_rows_masks(groups: list[ShardGroup]) -> list[torch.Tensor | None]:
    """A bool per buffer row of each group on the device, all set (nothing is known to equal a checkpoint yet);
    ``None`` for a tiered group. A hash group's mask is its ``DynamicRows.changed`` too, which marks new ids."""
    masks: list[torch.Tensor | None] = []
    for group in groups:
        if group.tier is not None:
            masks.append(None)
            continue
        mask = torch.ones(group.weight.size(0), dtype=torch.bool, device=group.weight.device)
        if group.dynamic is not None:
            group.dynamic.changed = mask
        masks.append(mask)
    return masks


def mark_changed(mask: torch.Tensor | None, rows: torch.Tensor) -> None:
    """Mark ``rows`` (of the group's buffer) changed; a tiered group (no mask) is always saved whole.

    On the CPU through numpy: torch's ``mask[rows] = True`` took 8-24 ms for a batch of 4096 x 26 ids, numpy's
    0.2 ms, against a sparse step of tens of ms.
    """
    if mask is None:
        return
    if mask.device.type == "cpu":
        mask.numpy()[rows.numpy()] = True
    else:
        mask[rows.to(mask.device)] = True


def delta_group_states(group: ShardGroup, mask: torch.Tensor | None, base_step: int) -> dict[str, Any]:
    """The pieces of ``group``'s tables: each table's changed rows over the full checkpoint of ``base_step``
    (whole pieces for a tiered group)."""
    if mask is None:
        return _tiered_delta_states(group, base_step)
    pieces = {}
    for shard, offset in zip(group.shards, group.buffer_offsets):
        if shard.dynamic is not None:
            piece = hash_shard_state(shard, changed=mask, whole_above=WHOLE_ABOVE)
            pieces[shard.config.name] = {**piece, DELTA_KEY: base_step} if "changed" in piece else piece
            continue
        rows = torch.nonzero(mask[offset : offset + shard.num_rows]).flatten()
        if rows.numel() > WHOLE_ABOVE * shard.num_rows:
            pieces.update(shard_states([shard])["tables"])
            continue
        pieces[shard.config.name] = {
            "row_start": shard.row_start,
            "row_end": shard.row_end,
            "num_rows": shard.config.num_rows,
            "row_ids": rows.cpu() + shard.row_start,
            DELTA_KEY: base_step,
            "weight": torch.index_select(shard.weight.detach(), 0, rows),  # half the time of weight[rows]
            "optimizer_state": {
                key: torch.index_select(tensor, 0, rows) for key, tensor in shard.optimizer_state.items()
            },
        }
    return pieces


def _tiered_delta_states(group: ShardGroup, base_step: int) -> dict[str, Any]:
    """A tiered group's pieces over the full checkpoint of ``base_step``: the rows its store had written since
    (``RowStore.changed``: the cache's changed rows go to the store first)."""
    assert group.tier is not None
    if group.dynamic is None:
        return tiered_group_states(group, {DELTA_KEY: base_step}, WHOLE_ABOVE)
    group.tier.flush()
    (shard,) = group.shards
    piece = hash_shard_state(shard, changed=torch.from_numpy(group.tier.store.changed), whole_above=WHOLE_ABOVE)
    return {shard.config.name: {**piece, DELTA_KEY: base_step} if "changed" in piece else piece}


def merge_delta(delta: Mapping[str, Any], base: Mapping[str, Any] | None, base_step: int) -> dict[str, Any]:
    """The sharded state ``{"tables": ...}`` of one rank: every delta piece of ``delta`` put over its table's piece
    in ``base`` (the same rank's state in the full checkpoint of ``base_step``), every whole piece as it is. A fixed
    table's rows are written into the base's tensors, which the result holds: a table as big as memory allows
    would not fit twice.

    :raises ShardedStateError: if a delta lies over another step, or the base lacks its table or does not
        hold the same rows.
    """
    tables: dict[str, Any] = {}
    for name, piece in delta["tables"].items():
        if DELTA_KEY not in piece:
            tables[name] = piece
            continue
        if piece[DELTA_KEY] != base_step:
            raise ShardedStateError(
                f"The delta of table '{name}' must lie over the checkpoint of step {base_step}, but lies over "
                f"{piece[DELTA_KEY]} instead."
            )
        under = (base or {}).get("tables", {}).get(name)
        if under is None or DELTA_KEY in under:
            raise ShardedStateError(
                f"The full checkpoint of step {base_step} must hold table '{name}' whole, under its delta, but "
                "does not."
            )
        if piece.get("kind") == "hash":
            tables[name] = _merge_hash(name, piece, under)
        elif "row_ids" in under:
            tables[name] = _merge_written_rows(piece, under)
        else:
            tables[name] = _merge_fixed(piece, under)
    return {**delta, "tables": tables}


def _merge_fixed(piece: Mapping[str, Any], under: Mapping[str, Any]) -> dict[str, Any]:
    name_range = (piece["row_start"], piece["row_end"])
    if "row_ids" in under or (under["row_start"], under["row_end"]) != name_range:
        raise ShardedStateError(
            f"The base piece under a delta must hold rows {list(name_range)} whole, but holds "
            f"{[under['row_start'], under['row_end']]}{' in part' if 'row_ids' in under else ''} instead."
        )
    target = piece["row_ids"] - piece["row_start"]
    weight, state = under["weight"], under["optimizer_state"]
    _check_state_keys(piece["optimizer_state"], state)
    weight[target] = piece["weight"].to(weight.device)
    for key, tensor in state.items():
        tensor[target] = piece["optimizer_state"][key].to(tensor.device)
    merged = {key: value for key, value in piece.items() if key not in ("row_ids", DELTA_KEY)}
    return {**merged, "weight": weight, "optimizer_state": state}


def _merge_written_rows(piece: Mapping[str, Any], under: Mapping[str, Any]) -> dict[str, Any]:
    """A tiered table's delta over its base, both of the rows steps wrote: the union of their rows, each with its
    values from the delta where it lists it."""
    rows, order = torch.sort(torch.cat([piece["row_ids"], under["row_ids"]]), stable=True)
    keep = torch.ones(rows.numel(), dtype=torch.bool)
    keep[1:] = rows[1:] != rows[:-1]  # the delta's entry comes first among equal rows: it wins
    rows, order = rows[keep], order[keep]
    _check_state_keys(piece["optimizer_state"], under["optimizer_state"])

    def union(changed: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
        return torch.cat([changed, base.to(changed.device)])[order]

    state = {key: union(tensor, under["optimizer_state"][key]) for key, tensor in piece["optimizer_state"].items()}
    merged = {key: value for key, value in piece.items() if key != DELTA_KEY}
    return {**merged, "row_ids": rows, "weight": union(piece["weight"], under["weight"]), "optimizer_state": state}


def _merge_hash(name: str, piece: Mapping[str, Any], under: Mapping[str, Any]) -> dict[str, Any]:
    """The delta's index with every entry's row: the changed ones from the delta, the others from the base, where
    the same slot held the same id (a slot given to another id since is marked changed)."""
    slots, keys = piece["index"]["slots"].long(), piece["index"]["keys"]
    base_slots, base_keys = under["index"]["slots"].long(), under["index"]["keys"]
    unchanged = torch.ones(slots.numel(), dtype=torch.bool)
    unchanged[piece["changed"]] = False
    capacity = int(piece["num_rows"]) + 1
    position = torch.full((capacity,), -1, dtype=torch.int64)
    position[base_slots] = torch.arange(base_slots.numel())
    source = position[slots[unchanged]]
    if bool((source < 0).any()) or not torch.equal(base_keys[source.clamp(min=0)], keys[unchanged]):
        raise ShardedStateError(
            f"The base of hash table '{name}''s delta must hold every unchanged slot with the same id, but does not."
        )
    _check_state_keys(piece["optimizer_state"], under["optimizer_state"])

    def whole(changed_rows: torch.Tensor, base_rows: torch.Tensor) -> torch.Tensor:
        rows = base_rows.new_empty((slots.numel(), *base_rows.shape[1:]))
        rows[unchanged] = base_rows[source]
        rows[piece["changed"]] = changed_rows.to(rows.device)
        return rows

    state = {key: whole(tensor, under["optimizer_state"][key]) for key, tensor in piece["optimizer_state"].items()}
    merged = {key: value for key, value in piece.items() if key not in ("changed", DELTA_KEY)}
    return {**merged, "weight": whole(piece["weight"], under["weight"]), "optimizer_state": state}


def _check_state_keys(delta: Mapping[str, torch.Tensor], base: Mapping[str, torch.Tensor]) -> None:
    if delta.keys() != base.keys():
        raise ShardedStateError(
            f"A delta's optimizer state must have the keys of its base's, {sorted(base)}, but has {sorted(delta)} "
            "instead."
        )
