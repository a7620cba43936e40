"""The CPU kernel's whole-row widening and rounding (vectorised, without branches) against the element-by-element
functions and the reference: the same bits for every kind of value, subnormals, infinities and NaN included."""

import numba
import numpy as np
import pytest
import torch

from embedding.kernels.half_rows import round_row, widen_row
from embedding.kernels.rounding import BFLOAT16, FLOAT16, element_random, round_array
from unit.embedding.kernels.test_rounding import values_of_every_kind

DTYPES = [(torch.float16, FLOAT16), (torch.bfloat16, BFLOAT16)]
DIM = 64


@numba.njit
def _round_rows(values, bases, kind, out):  # type: ignore[no-untyped-def]
    for row in range(values.shape[0]):
        round_row(values[row : row + 1], out, row, bases[row], kind)


@numba.njit
def _randoms(bases, dim, out):  # type: ignore[no-untyped-def]
    for row in range(bases.size):
        for d in range(dim):
            out[row, d] = element_random(bases[row], d)


@numba.njit
def _widen_rows(bits, kind, out):  # type: ignore[no-untyped-def]
    for row in range(bits.shape[0]):
        widen_row(bits, row, out[row : row + 1], kind)


@pytest.mark.parametrize(("dtype", "kind"), DTYPES)
def test_rows_round_as_the_reference_does_bit_for_bit(dtype, kind):
    values = values_of_every_kind()  # its edge cases last, padded with zeros to whole rows
    values = torch.cat([values, torch.zeros(-values.numel() % DIM)]).view(-1, DIM)
    bases = np.random.default_rng(4).integers(0, 1 << 63, values.size(0), dtype=np.uint64)
    randoms = np.empty((values.size(0), DIM), dtype=np.uint64)
    _randoms(bases, DIM, randoms)
    rounded = np.empty((values.size(0), DIM), dtype=np.uint16)

    _round_rows(values.view(torch.int32).numpy().view(np.uint32), bases, kind, rounded)

    expected = round_array(values.reshape(-1), randoms.reshape(-1), dtype).view(torch.int16).view(values.shape)
    assert torch.equal(torch.from_numpy(rounded.view(np.int16)), expected)


@pytest.mark.parametrize(("dtype", "kind"), DTYPES)
def test_rows_widen_exactly_for_every_bit_pattern(dtype, kind):
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).reshape(-1, DIM)
    widened = np.empty(bits.shape, dtype=np.float32)

    _widen_rows(bits, kind, widened)

    expected = torch.from_numpy(bits.view(np.int16)).view(dtype).float()
    actual = torch.from_numpy(widened)
    assert torch.equal(actual.isnan(), expected.isnan())
    assert torch.equal(actual[~expected.isnan()], expected[~expected.isnan()])
