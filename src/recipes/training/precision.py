"""Mixed precision: the autocast context of ``trainer.mixed_precision``, for training and scoring alike."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

Autocast = Callable[[], contextlib.AbstractContextManager[Any]]
"""A context manager factory: the forward passes run inside one."""

_DTYPES = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast_for(mixed_precision: str, device: torch.device) -> Autocast:
    """``torch.autocast`` in the dtype ``mixed_precision`` names on ``device``; nothing for ``none``."""
    dtype = _DTYPES[mixed_precision]
    if dtype is None:
        return contextlib.nullcontext
    return lambda: torch.autocast(device.type, dtype=dtype)
