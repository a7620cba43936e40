"""A rank's state of a checkpoint whose sparse tables are deltas: put back over its base's, whole.

A checkpoint saved with ``checkpoint.full_every`` above 1 may hold, for each table that tracks its
changed rows, only the rows changed since the last checkpoint that saved it whole: its base
(``CheckpointMetadata.base_step``, which the keep policies keep with it). Every reader of a checkpoint's rank
states (a resume, ``eval``, ``export``, a model bank) reads them through :func:`rank_state`, which merges the
deltas over the base's pieces of the same rank (``embedding.merge_delta``), so that none of them sees a delta.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from checkpoint import LoadedCheckpoint
from embedding import merge_delta


def rank_state(loaded: LoadedCheckpoint, old_rank: int) -> dict[str, Any]:
    """Old rank ``old_rank``'s state of ``loaded``, its sharded tables whole."""
    return merged(loaded, old_rank, loaded.load_rank_state(old_rank))


def merged(loaded: LoadedCheckpoint, old_rank: int, state: dict[str, Any]) -> dict[str, Any]:
    """``state``, old rank ``old_rank``'s of ``loaded`` as read, its sharded tables put over the base's, whole."""
    base = loaded.base
    if base is None or not isinstance(state.get("sharded"), Mapping):
        return state
    base_sharded = base_sharded_state(base, old_rank)
    state["sharded"] = {
        name: merge_delta(pieces, base_sharded.get(name), base.step) if _holds_tables(pieces) else pieces
        for name, pieces in state["sharded"].items()
    }
    return state


def base_sharded_state(base: LoadedCheckpoint, old_rank: int) -> Mapping[str, Any]:
    """The sharded state of the base's old rank ``old_rank`` (whole: a base holds no delta itself)."""
    sharded = rank_state(base, old_rank).get("sharded")
    return sharded if isinstance(sharded, Mapping) else {}


def _holds_tables(pieces: Any) -> bool:
    return isinstance(pieces, Mapping) and isinstance(pieces.get("tables"), Mapping)
