"""Random number generator states: seeded at the start, saved per rank, restored on resume.

Exact resume needs every stream a step draws from (python, numpy, torch, CUDA) back where it
was. States are stored as lists and tensors so that ``torch.load(weights_only=True)`` reads
them back.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": _list_state(random.getstate()),
        "numpy": _numpy_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    random.setstate(_tuple_state(state["python"]))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _list_state(state: Any) -> Any:
    """Python's RNG state with tuples as lists, which ``torch.load(weights_only=True)`` reads back."""
    return [_list_state(s) for s in state] if isinstance(state, tuple) else state


def _tuple_state(state: Any) -> Any:
    return tuple(_tuple_state(s) for s in state) if isinstance(state, list) else state


def _numpy_state() -> list[Any]:
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return [kind, torch.from_numpy(np.asarray(keys).astype(np.int64)), int(pos), int(has_gauss), float(cached)]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
