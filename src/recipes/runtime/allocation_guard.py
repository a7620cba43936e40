"""Refuse, before allocating it, a tensor of a recipe's build that the memory left could not hold.

The sparse tables check their bytes before they exist (``embedding.memory``); the rest of a model
(dense layers sized by ``model.hidden_dims``, an ``nn.Embedding`` sized by a vocabulary) is
allocated by torch as the recipe builds it. A layer far too big for the machine then ends in a raw
allocator error, or, where the system overcommits memory, in the out-of-memory killer once the
layer is initialised. So while a recipe builds, every tensor a torch factory is asked for is
counted first, with the ones still alive, against the memory the system says is available.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from embedding.memory import available_bytes
from recipes.errors import UserError

_FACTORIES = {
    torch.empty,
    torch.zeros,
    torch.ones,
    torch.full,
    torch.rand,
    torch.randn,
    torch.randint,
    torch.empty_strided,
    torch.arange,
}


class AllocationGuard(TorchFunctionMode):
    """While active, refuses a factory call whose tensor, with the guard's live tensors, exceeds ``available``."""

    def __init__(self, device: torch.device, available: int | None = None) -> None:
        super().__init__()
        self._device = device
        self._available = available_bytes(device) if available is None else available
        self._live = 0

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        shape, requested = _requested(func, args, kwargs) if func in _FACTORIES else ((), 0)
        if requested and self._on_device(kwargs) and self._available is not None:
            if self._live + requested > self._available:
                raise UserError(
                    f"Building the model needs a tensor of {_gib(requested)} ({func.__name__} of shape "
                    f"{list(shape)}) on top of the {_gib(self._live)} it holds, but only "
                    f"{_gib(self._available)} are available on this {self._device.type}: make the model smaller "
                    "(its layers' widths, its vocabularies' sizes) or use a machine with more memory."
                )
            self._live += requested
            result = func(*args, **kwargs)
            # The storage, not the tensor: a parameter made of the tensor keeps the storage, not the tensor object.
            weakref.finalize(result.untyped_storage(), self._freed, requested)
            return result
        return func(*args, **kwargs)

    def _freed(self, num_bytes: int) -> None:
        self._live -= num_bytes

    def _on_device(self, kwargs: Mapping[str, Any]) -> bool:
        device = torch.device(kwargs.get("device") or torch.get_default_device())
        return device.type == self._device.type


def _shape(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[int, ...]:
    size = kwargs.get("size", args[0] if args else ())
    if isinstance(size, int):  # torch.empty(3, 4): the sizes as arguments
        size = tuple(arg for arg in args if isinstance(arg, int))
    return tuple(int(dim) for dim in size)


def _requested(func: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[tuple[int, ...], int]:
    """The shape of the tensor a factory call makes, and its bytes (0: a call this guard does not read)."""
    if func is torch.randint:  # randint(high, size) or randint(low, high, size)
        args = [arg for arg in args if isinstance(arg, (tuple, list, torch.Size))]
    try:
        shape = _arange_length(args, kwargs) if func is torch.arange else _shape(args, kwargs)
    except (TypeError, ValueError):
        return (), 0  # torch will check it.
    integral = func is torch.randint or (func is torch.arange and all(isinstance(a, int) for a in args))
    dtype = kwargs.get("dtype") or (torch.int64 if integral else torch.get_default_dtype())
    element = torch.empty((), dtype=dtype).element_size()
    return shape, math.prod(shape) * element


def _arange_length(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[int, ...]:
    """The shape ``torch.arange(end)``, ``(start, end)`` or ``(start, end, step)`` makes."""
    numbers = [float(arg) for arg in args if isinstance(arg, (int, float))]
    start, end, step = (
        (0.0, numbers[0], 1.0) if len(numbers) == 1 else (*numbers[:2], numbers[2] if len(numbers) > 2 else 1.0)
    )
    return (max(0, math.ceil((end - start) / step)),)


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / 2**30:.1f} GiB"
