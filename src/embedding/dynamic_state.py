"""Checkpoint pieces of hash tables: the ids a shard holds, with their rows, optimizer state and counters.

A piece is ``{"kind": "hash", "num_rows" (the capacity), "dim", "rank", "num_ranks", "weight",
"optimizer_state", "index": {...}}`` where row ``i`` of ``weight`` and of every optimizer state
belongs to id ``index["keys"][i]``, held in slot ``index["slots"][i]``. Only used slots are
saved, so a checkpoint grows with the ids seen, not with the capacity.

Loading into the layout that saved a piece restores its slots, sketch and counters exactly, so
that the run goes on bit-exact. Into another number of ranks, every rank takes the ids that
hash to it now from all pieces, in id order; if they outnumber its slots, it keeps those its
eviction policy scores highest, the ids it would evict last. Counts of ids without a row carry
over, summed over the pieces and resized to the new shards' sketch width.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numba
import numpy as np
import numpy.typing as npt
import torch

from embedding import compiled_source
from embedding.eviction import Score
from embedding.hash_index import resize_sketch
from embedding.id_hashing import owner_ranks
from embedding.sharding import TableShard
from embedding.state import ShardedStateError, check_whole
from embedding.tiered_state import read_records, write_records

_SAVED_INDEX_KEYS = ("step", "slots", "keys", "last_seen", "frequency", "sketch", "counters")


def hash_shard_state(
    shard: TableShard, changed: torch.Tensor | None = None, whole_above: float = 1.0
) -> dict[str, Any]:
    """A copy of ``shard``'s used rows and index: lookups in training change both before the next step.

    With ``changed`` (a bool per slot), only the rows of the slots it marks, and at ``"changed"`` the
    positions of their entries in the index, which stays whole (a delta: see :mod:`embedding.row_changes`);
    every row, and no ``"changed"``, where it marks more than ``whole_above`` of the used slots.
    """
    assert shard.dynamic is not None
    index = shard.dynamic.index.state_dict()
    slots = torch.from_numpy(index["slots"]).long()
    extra = {}
    if changed is not None:
        positions = torch.nonzero(changed.cpu()[slots]).flatten()
        if positions.numel() <= whole_above * slots.numel():
            slots, extra = slots[positions], {"changed": positions}
    rows = slots.to(shard.weight.device)
    if shard.tier is not None:  # rows in the store, read as they are after the cache's write-back
        weight, state = read_records(shard.tier, slots)
    else:
        weight, state = shard.weight.detach()[rows], {name: t[rows] for name, t in shard.optimizer_state.items()}
    return {
        "kind": "hash",
        "num_rows": shard.config.num_rows,
        "dim": shard.config.dim,
        "rank": shard.dynamic.rank,
        "num_ranks": shard.dynamic.num_ranks,
        "weight": weight,
        "optimizer_state": state,
        "index": {key: _tensor(index[key]) for key in _SAVED_INDEX_KEYS},
        **extra,
    }


def load_hash_shard(shard: TableShard, pieces: Sequence[Mapping[str, Any]]) -> None:
    """Fill ``shard`` from the pieces of its table in ``pieces`` (see the module's docstring)."""
    assert shard.dynamic is not None
    name = shard.config.name
    saved = [piece["tables"][name] for piece in pieces if name in piece["tables"]]
    if not saved:
        raise ShardedStateError(f"The checkpoint pieces must hold table '{name}', but hold no piece of it.")
    for piece in saved:
        _check_piece(shard, piece)
    dynamic = shard.dynamic
    own = [p for p in saved if (p["rank"], p["num_ranks"]) == (dynamic.rank, dynamic.num_ranks)]
    if (
        own
        and own[0]["weight"].size(0) <= shard.num_rows
        and own[0]["index"]["sketch"].shape == dynamic.index.sketch.shape
    ):
        _restore(shard, own[0])
    else:
        _reshard(shard, saved)


def _check_piece(shard: TableShard, piece: Mapping[str, Any]) -> None:
    name = shard.config.name
    check_whole(name, piece)
    if piece.get("kind") != "hash":
        raise ShardedStateError(
            f"Table '{name}' is a hash table, but the checkpoint holds a fixed table of that name: "
            "a fixed table's rows do not say which ids they belong to."
        )
    shape, saved_shape = (shard.config.num_rows, shard.config.dim), (piece["num_rows"], piece["dim"])
    if shape != saved_shape:
        raise ShardedStateError(
            f"Hash table '{name}' must have capacity x dim {shape} in the checkpoint, but has {saved_shape} instead."
        )
    if (
        piece["optimizer_state"]
        and shard.optimizer_state
        and piece["optimizer_state"].keys() != shard.optimizer_state.keys()
    ):
        raise ShardedStateError(
            f"The optimizer state of table '{name}' must have the keys {sorted(shard.optimizer_state)} in the "
            f"checkpoint, but has {sorted(piece['optimizer_state'])} instead."
        )


def _restore(shard: TableShard, piece: Mapping[str, Any]) -> None:
    assert shard.dynamic is not None
    index = piece["index"]
    shard.dynamic.index.load_state_dict({key: _numpy(value) for key, value in index.items()})
    _copy_rows(shard, piece["weight"], piece["optimizer_state"], index["slots"])


def _reshard(shard: TableShard, saved: Sequence[Mapping[str, Any]]) -> None:
    assert shard.dynamic is not None
    dynamic = shard.dynamic
    keys = np.concatenate([_numpy(p["index"]["keys"]) for p in saved])
    last_seen = np.concatenate([_numpy(p["index"]["last_seen"]) for p in saved])
    frequency = np.concatenate([_numpy(p["index"]["frequency"]) for p in saved])
    mine = np.flatnonzero(owner_ranks(keys, dynamic.num_ranks) == dynamic.rank)
    if mine.size > shard.num_rows:
        mine = mine[_kept(shard, keys[mine], last_seen[mine], frequency[mine])]
    mine = mine[np.argsort(keys[mine], kind="stable")]
    step = max(int(p["index"]["step"]) for p in saved)
    slots = dynamic.index.load_keys(keys[mine], last_seen[mine], frequency[mine], step)
    # Each id was counted on its owner only, so the sum of the pieces' sketches counts every id.
    width = dynamic.index.sketch.shape[1]
    sketches = [resize_sketch(_numpy(p["index"]["sketch"]), width).astype(np.int64) for p in saved]
    sketch = np.minimum(np.sum(sketches, axis=0), 2**31 - 1).astype(np.int32)
    # Cumulative admitted, rejected and evicted: the sums move to rank 0.
    totals = np.sum([_numpy(p["index"]["counters"])[2:] for p in saved], axis=0) if dynamic.rank == 0 else None
    dynamic.index.load_counts(sketch, totals)

    weight = torch.cat([p["weight"] for p in saved])[torch.from_numpy(mine)]
    names = saved[0]["optimizer_state"].keys()
    state = {name: torch.cat([p["optimizer_state"][name] for p in saved])[torch.from_numpy(mine)] for name in names}
    _copy_rows(shard, weight, state, torch.from_numpy(slots))


def _kept(
    shard: TableShard,
    keys: npt.NDArray[np.int64],
    last_seen: npt.NDArray[np.int32],
    frequency: npt.NDArray[np.int32],
) -> npt.NDArray[np.int64]:
    """Which of more ids than ``shard`` has slots it keeps: the highest by its eviction policy's score, the
    lower id first among equal scores."""
    assert shard.dynamic is not None
    dynamic = shard.dynamic
    score = dynamic.index.eviction.score
    if score is None:
        raise ShardedStateError(
            f"Hash table '{shard.config.name}' must fit its ids into {shard.num_rows:,} rows on rank "
            f"{dynamic.rank}, but the checkpoint holds {keys.size:,} of them and its eviction is "
            f"'{dynamic.config.hash_policy.eviction.name}', which gives up no id."
        )
    scores = np.empty(keys.size, dtype=np.int64)
    _scores_kernel(score)(keys, last_seen, frequency, scores)
    kept: npt.NDArray[np.int64] = np.lexsort((keys, -scores))[: shard.num_rows]
    return kept


@functools.cache
def _scores_kernel(score: Score) -> Any:
    """The kernel that writes the eviction ``score`` of every slot of saved per-slot arrays, once per score."""

    score_source = compiled_source.source_digest(score)  # An edited score compiles anew (see compiled_source).

    @numba.njit(cache=True)
    def scores_of(keys, last_seen, frequency, scores):  # type: ignore[no-untyped-def]
        score_source  # noqa: B018 (named, so that the kernel captures it)
        for slot in range(keys.size):
            scores[slot] = score(keys, last_seen, frequency, slot)

    return scores_of


def _copy_rows(shard: TableShard, weight: torch.Tensor, state: Mapping[str, torch.Tensor], slots: torch.Tensor) -> None:
    if shard.tier is not None:
        records = weight.cpu().float()  # a table off the device stores float32 rows, whatever the saved dtype
        write_records(shard.tier, slots.cpu(), records, {k: v.cpu() for k, v in state.items()}, shard.config.name)
        return
    rows = slots.to(shard.weight.device)
    shard.weight[rows] = weight.to(shard.weight.device, shard.weight.dtype)
    if state and shard.optimizer_state:
        for name, tensor in shard.optimizer_state.items():
            tensor[rows] = state[name].to(tensor.device)


def _tensor(value: Any) -> Any:
    return torch.from_numpy(value) if isinstance(value, np.ndarray) else value


def _numpy(value: Any) -> Any:
    return value.numpy() if isinstance(value, torch.Tensor) else value
