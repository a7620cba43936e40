"""The bags' weighted sums straight from half-precision rows, on the CPU: each row widened as it is read.

``embedding_bag`` takes float32 rows; a float16 or bfloat16 table's lookup used to gather its rows
(``index_select``), widen the copy to float32 and pool that, two passes over the batch's rows more than a float32
table's lookup. Here one parallel pass reads each id's half row (half the bytes of a float32 row), widens it in
registers (F16C for float16, a shift for bfloat16) and adds it, scaled, to its bag's sum, in the bag's order, as
``embedding_bag`` does.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from numba import njit, prange, types
from numba.extending import intrinsic

from embedding.kernels.half_rows import bfloat16_to_float32, float16_to_float32
from embedding.kernels.prefetch import prefetch_for_read
from embedding.kernels.rounding import BFLOAT16, kind_of

_PREFETCH_DISTANCE = 16
"""How many ids ahead a bag's rows are prefetched (the rows are scattered over a table larger than the caches)."""

_BYTES_PER_LINE = 64
_NO_SCALES: npt.NDArray[np.float32] = np.empty(0, dtype=np.float32)


@intrinsic  # type: ignore[untyped-decorator]
def _fused_multiply_add(typingctx: Any, a: Any, b: Any, c: Any) -> Any:
    """``a * b + c`` (float32) rounded once, as ``embedding_bag``'s weighted sum (FBGEMM's) computes it."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.fma(*args)

    return types.float32(types.float32, types.float32, types.float32), codegen


def pooled_half_rows(
    weight: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor, scales: torch.Tensor | None
) -> torch.Tensor:
    """The sums of the rows of ``weight`` (float16 or bfloat16, on the CPU) that ``ids[offsets[b]:offsets[b + 1]]``
    name, each times its ``scales`` entry if given, in float32: ``embedding_bag``'s ``mode="sum"`` with
    ``include_last_offset=True`` on the widened rows.

    :raises IndexError: if an id is not a row of ``weight``.
    """
    pooled = torch.empty((offsets.numel() - 1, weight.size(1)), dtype=torch.float32)
    out_of_range = _pool(
        weight.detach().view(torch.int16).numpy().view(np.uint16),
        kind_of(weight.dtype),
        ids.numpy(),
        offsets.numpy(),
        _NO_SCALES if scales is None else scales.detach().numpy(),
        scales is not None,
        pooled.numpy(),
    )
    if out_of_range:
        raise IndexError(f"ids must be rows of the table, in [0, {weight.size(0)}), but {out_of_range} are not.")
    return pooled


@njit(parallel=True, cache=True)
def _pool(weight_bits, kind, ids, offsets, scales, has_scales, pooled):  # type: ignore[no-untyped-def]
    """Fill ``pooled``; the number of ids outside the table (their rows left out)."""
    num_rows, dim = weight_bits.shape
    row_bytes = dim * 2
    out_of_range = 0
    for bag in prange(offsets.size - 1):
        for d in range(dim):
            pooled[bag, d] = 0
        end = offsets[bag + 1]
        for k in range(offsets[bag], end):
            if k + _PREFETCH_DISTANCE < ids.size:
                coming = ids[k + _PREFETCH_DISTANCE]
                if 0 <= coming < num_rows:
                    for offset in range(0, row_bytes, _BYTES_PER_LINE):
                        prefetch_for_read(weight_bits, (coming, offset // 2))
            row = ids[k]
            if row < 0 or row >= num_rows:
                out_of_range += 1
                continue
            scale = scales[k] if has_scales else np.float32(1)
            if kind == BFLOAT16:
                for d in range(dim):
                    pooled[bag, d] = _fused_multiply_add(
                        scale, bfloat16_to_float32(weight_bits[row, d]), pooled[bag, d]
                    )
            else:
                for d in range(dim):
                    widened = float16_to_float32(weight_bits[row, d])
                    pooled[bag, d] = _fused_multiply_add(scale, widened, pooled[bag, d])
    return out_of_range
