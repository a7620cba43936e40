"""What ``CheckpointManager.save`` refuses before any file is written: each a ``CheckpointError`` of one line."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from checkpoint.errors import CheckpointError
from checkpoint.loaded import RANK_FILE_NAME
from checkpoint.metadata import CheckpointMetadata
from checkpoint.serialization import check_serializable

_SHARED_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


def check_arguments(step: int, score: float | None, extras: Mapping[str, Any], base_step: int | None) -> None:
    """The step, score, extras and base of a save, on every rank."""
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CheckpointError(f"`step` must be an integer >= 0, but is {step!r} instead.")
    if score is not None and not (isinstance(score, int | float) and math.isfinite(score)):
        raise CheckpointError(f"`score` must be None or a finite number, but is {score!r} instead.")
    try:
        json.dumps(extras, allow_nan=False)
    except (TypeError, ValueError) as ex:
        raise CheckpointError(f"`extras` must hold only JSON values, but does not: {ex}") from ex
    if base_step is not None and (not isinstance(base_step, int) or isinstance(base_step, bool) or base_step >= step):
        raise CheckpointError(f"`base_step` must be None or a step before {step}, but is {base_step!r} instead.")


def check_base(step: int, base_step: int, committed: Mapping[int, CheckpointMetadata]) -> None:
    """A base that is there: the rank files of the save of ``step`` lie over it (rank 0 lists the checkpoints)."""
    if base_step not in committed:
        raise CheckpointError(
            f"`base_step` must be a committed checkpoint's step, which the save of step {step} lies over, but "
            f"{base_step} is not one (committed: {sorted(committed)})."
        )


def check_shared_state(shared_state: Mapping[str, Any]) -> None:
    """Keys that name files, and values ``torch.load(weights_only=True)`` reads back (rank 0 writes them)."""
    for key in shared_state:
        if not (isinstance(key, str) and _SHARED_KEY.fullmatch(key)) or RANK_FILE_NAME.fullmatch(f"{key}.pt"):
            raise CheckpointError(
                "The keys of `shared_state` name its files, so they must be letters, digits, '_' and '-' "
                f"(not rank_N), but one is {key!r} instead."
            )
    check_serializable(shared_state, "shared_state")
