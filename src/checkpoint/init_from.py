"""Initialise a model from another run's checkpoint (a "model bank"), keeping only chosen parameters.

A new run often reuses part of a trained model, for instance its embedding tables but not its
head. The caller names the parameters with glob patterns (``fnmatch``) and applies the returned
state dict to its model.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Any

import torch

from checkpoint.errors import CheckpointError, CheckpointNotFoundError
from checkpoint.loaded import shared_file_name, shared_keys
from checkpoint.metadata import METADATA_FILE_NAME
from checkpoint.serialization import read_torch_file
from checkpoint.store import CheckpointStore

log = logging.getLogger(__name__)


def load_model_state_for_init(
    source: str,
    model_state: Mapping[str, Any],
    *,
    model_key: str = "model",
    include: Sequence[str] = ("*",),
    exclude: Sequence[str] = (),
    strict: bool = True,
) -> dict[str, Any]:
    """The entries of ``source``'s model state whose names match ``include`` and no ``exclude`` pattern.

    ``source`` is a ``step_N`` directory, or a checkpoints root meaning its last checkpoint.
    ``model_state`` is the state dict of the model to initialise; with ``strict``, every one of
    its selected entries must be in the source with the same shape, and the source may select
    nothing the model lacks. Without ``strict``, those entries are left out, with a log line.
    """
    source_state = _read_model_state(source, model_key)
    selected = {
        name: value
        for name, value in source_state.items()
        if any(fnmatchcase(name, p) for p in include) and not any(fnmatchcase(name, p) for p in exclude)
    }
    wanted = {
        name
        for name in model_state
        if any(fnmatchcase(name, p) for p in include) and not any(fnmatchcase(name, p) for p in exclude)
    }
    missing = sorted(wanted - selected.keys())
    unexpected = sorted(selected.keys() - model_state.keys())
    mismatched = sorted(
        name for name in selected.keys() & model_state.keys() if _shape(selected[name]) != _shape(model_state[name])
    )
    problems = []
    if missing:
        problems.append(f"missing from the source: {missing}")
    if unexpected:
        problems.append(f"not in the model: {unexpected}")
    if mismatched:
        shapes = [f"{n} {_shape(selected[n])} vs {_shape(model_state[n])}" for n in mismatched]
        problems.append(f"with other shapes (source vs model): {shapes}")
    if problems and strict:
        raise CheckpointError(
            f"The model state of `{source}` must match the selected parameters of the model, but has entries "
            + "; ".join(problems)
            + "."
        )
    if problems:
        log.warning("Initialising from %s leaves out entries %s.", source, "; ".join(problems))
    dropped = set(unexpected) | set(mismatched)
    return {name: value for name, value in selected.items() if name not in dropped}


def _read_model_state(source: str, model_key: str) -> dict[str, Any]:
    store = CheckpointStore(source)
    step_dir = store.root
    if not store.fs.exists(f"{step_dir}/{METADATA_FILE_NAME}"):
        committed = store.scan().committed
        if not committed:
            raise CheckpointNotFoundError(
                f"`source` must be a checkpoint directory or a checkpoints root holding one, "
                f"but {source} holds no committed checkpoint."
            )
        step_dir = store.step_dir(max(committed))
    metadata = store.read_metadata(step_dir)
    file_name = shared_file_name(model_key)
    record = metadata.files.get(file_name)
    if record is None:
        raise CheckpointError(
            f"`model_key` must name the model state in {step_dir}, one of {sorted(shared_keys(metadata))}, "
            f"but is '{model_key}' instead."
        )
    model_state = read_torch_file(store.fs, f"{step_dir}/{file_name}", record).get(model_key)
    if not isinstance(model_state, dict):
        raise CheckpointError(f"`{step_dir}/{file_name}` must hold the model state as a dict, but does not.")
    return model_state


def _shape(value: Any) -> tuple[int, ...] | None:
    return tuple(value.shape) if isinstance(value, torch.Tensor) else None
