"""Stochastic rounding to float16 and bfloat16: the compiled functions the kernels call against the numpy ones the
reference calls, bit for bit; each result a neighbour of the value, unbiased, and a pure function of its key."""

import numba
import numpy as np
import pytest
import torch

from embedding.kernels.rounding import (
    BFLOAT16,
    FLOAT16,
    RowKeys,
    element_random,
    random_bits,
    round_array,
    round_stochastically,
    row_key,
    row_random_base,
    widen,
)

DTYPES = [(torch.float16, FLOAT16), (torch.bfloat16, BFLOAT16)]


@numba.njit
def _widen_all(bits, kind, out):  # type: ignore[no-untyped-def]
    for i in range(bits.size):
        out[i] = widen(bits[i], kind)


@numba.njit
def _round_all(bits, random, kind, out):  # type: ignore[no-untyped-def]
    for i in range(bits.size):
        out[i] = round_stochastically(bits[i], random[i], kind)


@numba.njit
def _random_all(rows, step, dim, ends, bases, salts, slot_ids, out):  # type: ignore[no-untyped-def]
    for i in range(rows.size):
        salt, key = row_key(rows[i], ends, bases, salts, slot_ids)
        base = row_random_base(salt, step, key)
        for d in range(dim):
            out[i, d] = element_random(base, d)


def compiled_round(values: torch.Tensor, random: np.ndarray, kind: int) -> torch.Tensor:
    out = np.empty(values.numel(), dtype=np.uint32)
    _round_all(values.view(torch.int32).numpy().view(np.uint32), random, kind, out)
    return torch.from_numpy(out.astype(np.uint16).view(np.int16))


def values_of_every_kind() -> torch.Tensor:
    """Random values over 18 decades (subnormal in float16 to beyond its range), and the edge cases."""
    generator = torch.Generator().manual_seed(0)
    scales = 10.0 ** torch.randint(-12, 6, (20_000,), generator=generator).float()
    edges = [0.0, -0.0, float("inf"), -float("inf"), float("nan"), 65504.0, 65519.0, 65520.0, -70000.0]
    edges += [1e-45, -1e-40, 2**-24, 3e-8, 2**-14, -(2**-15) * 1.5, 3.4e38]
    return torch.cat([torch.randn(20_000, generator=generator) * scales, torch.tensor(edges)])


@pytest.mark.parametrize(("dtype", "kind"), DTYPES)
def test_widening_is_exact_for_every_bit_pattern(dtype, kind):
    bits = np.arange(1 << 16, dtype=np.uint32)
    out = np.empty(bits.size, dtype=np.uint32)

    _widen_all(bits, kind, out)

    expected = torch.from_numpy(bits.astype(np.uint16).view(np.int16)).view(dtype).float()
    widened = torch.from_numpy(out.view(np.int32)).view(torch.float32)
    assert torch.equal(widened.isnan(), expected.isnan())
    assert torch.equal(widened[~expected.isnan()], expected[~expected.isnan()])


@pytest.mark.parametrize(("dtype", "kind"), DTYPES)
def test_compiled_rounding_equals_the_references_bit_for_bit(dtype, kind):
    values = values_of_every_kind()
    random = np.random.default_rng(1).integers(0, 1 << 32, values.numel(), dtype=np.uint64)

    assert torch.equal(compiled_round(values, random, kind), round_array(values, random, dtype).view(torch.int16))


@pytest.mark.parametrize(("dtype", "kind"), DTYPES)
def test_a_rounded_value_is_one_of_its_two_neighbours_and_specials_stay(dtype, kind):
    values = values_of_every_kind()
    rounded = round_array(values, np.random.default_rng(2).integers(0, 1 << 32, values.numel()), dtype).float()

    finite = values.isfinite() & (values.abs() < 65504)
    nearest = values.to(dtype)
    beyond = torch.where(nearest.float() < values, float("inf"), -float("inf")).to(dtype)
    other = torch.nextafter(nearest, beyond).float()  # the neighbour on the value's other side
    neighbour = (rounded == nearest.float()) | (rounded == other)
    assert bool(neighbour[finite].all())
    assert torch.equal(rounded[values.isnan()].isnan(), torch.ones_like(rounded[values.isnan()], dtype=torch.bool))
    assert rounded[values == float("inf")].item() == float("inf")
    exact = values.to(dtype).float() == values
    assert torch.equal(rounded[exact & finite], values[exact & finite])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("value", [0.1234567, -3.3e-7, 1.0 + 1e-4, 7.7e-6])
def test_rounding_is_unbiased_where_rounding_to_nearest_is_not(dtype, value):
    """The mean of many roundings of a value (under both its neighbours) is the value, within the sampling error;
    round to nearest is off by up to half a gap every time."""
    count = 200_000
    rounded = round_array(torch.full((count,), value), np.random.default_rng(3).integers(0, 1 << 32, count), dtype)

    nearest = torch.tensor(value).to(dtype)
    gap = abs(float(torch.nextafter(nearest, torch.tensor(2 * value).to(dtype))) - float(nearest))
    tolerance = 2.5 * gap / count**0.5  # five standard deviations of the mean at worst
    assert abs(float(rounded.double().mean()) - np.float32(value)) < tolerance
    assert abs(float(nearest) - np.float32(value)) > tolerance


def test_random_bits_are_a_function_of_the_salt_step_global_row_and_element():
    """The reference's and the kernels' bits agree; a row keeps its bits wherever it lies in a buffer; another step,
    salt or row draws other bits."""
    dim, step = 5, 7
    # Two shards: table A's rows 0..3 in buffer rows 0..3, table B's rows 10..15 in buffer rows 4..9.
    keys = RowKeys(
        np.array([11, 22], dtype=np.uint64), np.array([4, 10], dtype=np.int64), np.array([0, 6], dtype=np.int64)
    )
    rows = np.arange(10, dtype=np.int64)
    compiled = np.empty((10, dim), dtype=np.uint64)
    _random_all(rows, step, dim, keys.ends, keys.bases, keys.salts, np.empty(0, dtype=np.int64), compiled)

    assert np.array_equal(random_bits(keys, rows, step, dim), compiled)
    alone = RowKeys(np.array([22], dtype=np.uint64), np.array([6], dtype=np.int64), np.array([10], dtype=np.int64))
    assert np.array_equal(random_bits(alone, np.arange(6), step, dim), compiled[4:])
    assert np.array_equal(random_bits(keys, rows, step, dim), random_bits(keys, rows, step, dim))
    assert not np.array_equal(random_bits(keys, rows, step + 1, dim), compiled)
    assert len(np.unique(compiled)) == compiled.size
    assert (compiled < (1 << 32)).all()


def test_a_hash_tables_rows_are_keyed_by_the_id_in_their_slot():
    ids = np.array([5, -9, 123456789012], dtype=np.int64)
    keys = RowKeys(np.array([3], dtype=np.uint64), np.array([3], dtype=np.int64), np.zeros(1, np.int64), ids)
    moved = RowKeys(np.array([3], dtype=np.uint64), np.array([3], dtype=np.int64), np.zeros(1, np.int64), ids[::-1])
    compiled = np.empty((3, 4), dtype=np.uint64)
    _random_all(np.arange(3), 2, 4, keys.ends, keys.bases, keys.salts, ids, compiled)

    assert np.array_equal(random_bits(keys, np.arange(3), 2, 4), compiled)
    assert np.array_equal(random_bits(moved, np.arange(3)[::-1].copy(), 2, 4), compiled)
