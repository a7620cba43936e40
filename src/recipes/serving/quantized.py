"""Row-wise int8 and int4 rows for serving, in FBGEMM's fused N-bit layout with fp16 scale and bias.

A served table is read, never trained, so its rows need not be float32: each row quantised on its own
range (its minimum and maximum) keeps the relative error small whatever the row's magnitude, which is
why FBGEMM serves embeddings this way. The rounding is FBGEMM's ``FloatToFusedNBitRowwiseQuantizedSBHalf``
(its reference, bit rate 8 or 4): ``bias`` is the row's minimum rounded to fp16, ``scale`` is
``(max - bias) / (2**bits - 1)`` rounded to fp16 (1.0 where that is 0: a constant row), and each value's code
is ``rint((x - bias) / scale)`` clamped to ``0..2**bits - 1``. Int4 packs two codes a byte, the first
in the low nibble; an odd dim leaves the last byte's high nibble 0. A row is read back as
``code * scale + bias`` in float32.

FBGEMM's fused row is ``codes ‖ scale ‖ bias`` (``ceil(dim * bits / 8) + 4`` bytes: dim + 4 for int8);
the export keeps the same three parts as Parquet columns (``codes`` ``fixed_size_list<uint8>``, ``scale``
and ``bias`` float16), so a serving system that takes the fused row concatenates them per row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

BITS = {"int8": 8, "int4": 4}
"""The quantised dtypes ``export --dtype`` takes, and their bits a value."""


@dataclass(frozen=True)
class QuantizedRows:
    """Rows quantised row-wise: ``codes`` ``[rows, code_bytes(dim, bits)]`` uint8, ``scale`` and ``bias`` ``[rows]``
    float16."""

    codes: npt.NDArray[np.uint8]
    scale: npt.NDArray[np.float16]
    bias: npt.NDArray[np.float16]


def code_bytes(dim: int, bits: int) -> int:
    """The bytes of one row's codes: ``dim`` for int8, ``ceil(dim / 2)`` for int4."""
    per_byte = 8 // bits
    return (dim + per_byte - 1) // per_byte


def quantize(rows: npt.NDArray[np.float32], bits: int) -> QuantizedRows:
    """``rows`` ``[n, dim]`` as FBGEMM's SBHalf reference quantises them (see the module's docstring)."""
    rows = np.asarray(rows, dtype=np.float32)
    num_rows, dim = rows.shape
    levels = (1 << bits) - 1
    if num_rows == 0 or dim == 0:
        empty = np.zeros(num_rows, np.float16)
        return QuantizedRows(np.zeros((num_rows, code_bytes(dim, bits)), np.uint8), empty, empty.copy())
    bias = rows.min(axis=1).astype(np.float16)
    low = bias.astype(np.float32)
    span = rows.max(axis=1) - low
    scale = np.where(span == 0, np.float32(1), span / np.float32(levels)).astype(np.float16)
    scale[scale == 0] = 1  # a range too small for fp16: any scale codes (x - bias) ~ 0 as 0
    with np.errstate(divide="ignore", over="ignore"):
        inverse = np.float32(1) / scale.astype(np.float32)
    unusable = np.isinf(inverse)
    scale[unusable], inverse[unusable] = 1, 1
    codes = np.clip(np.rint((rows - low[:, None]) * inverse[:, None]), 0, levels).astype(np.uint8)
    if bits == 4:
        if dim % 2:
            codes = np.concatenate([codes, np.zeros((num_rows, 1), np.uint8)], axis=1)
        codes = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return QuantizedRows(np.ascontiguousarray(codes), scale, bias)


def dequantize(quantized: QuantizedRows, dim: int, bits: int) -> npt.NDArray[np.float32]:
    """The float32 rows ``[n, dim]``: each code times its row's scale plus its bias."""
    codes = quantized.codes
    if bits == 4:
        codes = np.stack([codes & 15, codes >> 4], axis=2).reshape(len(codes), 2 * codes.shape[1])[:, :dim]
    scale = quantized.scale.astype(np.float32)[:, None]
    return codes.astype(np.float32) * scale + quantized.bias.astype(np.float32)[:, None]
