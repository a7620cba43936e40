"""The CPU sort of a batch's ids by the digits below the table's size, against torch's stable sort."""

import numpy as np
import pytest
import torch

from embedding.kernels import SortedIds
from embedding.kernels.radix_sort import digit_bits, radix_sort


@pytest.mark.parametrize(
    ("num_rows", "bits"),
    [
        (1, [1]),
        (2, [1]),
        (4096, [12]),
        (4097, [7, 6]),
        (1_000_000, [10, 10]),
        (10**7, [12, 12]),
        (2**31 - 1, [11, 10, 10]),
    ],
)
def test_digit_bits_are_as_few_passes_as_the_table_needs_split_evenly(num_rows, bits):
    assert digit_bits(num_rows) == bits


@pytest.mark.parametrize("num_rows", [1, 2, 3, 1000, 4097, 1_000_000, 10**7, 2**31 - 1, 2**40])
@pytest.mark.parametrize("spread", ["zipf", "uniform"])
def test_sorts_as_torch_stable_sort_does(num_rows, spread):
    rng = np.random.default_rng(num_rows)
    values = rng.zipf(1.1, 20_000) if spread == "zipf" else rng.integers(0, num_rows, 20_000)
    ids = torch.from_numpy(values % num_rows)

    sort = SortedIds.of(ids, num_rows)

    keys, order = torch.sort(ids.to(SortedIds.key_dtype(num_rows)), stable=True)
    assert sort.keys.dtype == keys.dtype
    assert torch.equal(sort.keys, keys)
    assert torch.equal(sort.order, order)


def test_writes_into_given_tensors_and_sorts_no_ids():
    keys, order = torch.empty(5, dtype=torch.int32), torch.empty(5, dtype=torch.int64)

    sort = SortedIds.of(torch.tensor([4, 1, 4, 0, 1]), 5, out=(keys, order))

    assert sort.keys is keys and sort.order is order
    assert keys.tolist() == [0, 1, 1, 4, 4] and order.tolist() == [3, 1, 4, 0, 2]
    empty = SortedIds.of(torch.empty(0, dtype=torch.int64), 5)
    assert empty.keys.numel() == 0 and empty.order.numel() == 0


@pytest.mark.parametrize("outside", [-1, 8, 2**40])
def test_ids_outside_the_digits_are_refused_by_the_passes_and_sorted_by_torch(outside):
    ids = torch.tensor([3, outside, 3, 0])
    bits = np.array(digit_bits(8), dtype=np.int64)

    assert not radix_sort(ids.numpy(), bits, np.empty(4, np.int32), np.empty(4, np.int64))
    sort = SortedIds.of(ids, 8)
    keys, order = torch.sort(ids.to(torch.int32), stable=True)
    assert torch.equal(sort.keys, keys) and torch.equal(sort.order, order)


def test_keys_of_more_than_31_bits_are_refused_by_the_passes():
    ids = torch.tensor([3, 1, 2])

    assert not radix_sort(ids.numpy(), np.array([12, 12, 8], np.int64), np.empty(3, np.int32), np.empty(3, np.int64))
