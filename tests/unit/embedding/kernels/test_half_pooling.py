"""The bags' sums pooled straight from half-precision rows: bit for bit ``embedding_bag`` on the widened rows."""

import pytest
import torch
import torch.nn.functional as F

from embedding.kernels.half_pooling import pooled_half_rows


def bags(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Ids into a 300-row table in bags of 0 to 6 ids (empty ones included), and a scale per id."""
    generator = torch.Generator().manual_seed(seed)
    sizes = torch.randint(0, 7, (200,), generator=generator)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), sizes.cumsum(0)])
    ids = torch.randint(0, 300, (int(offsets[-1]),), generator=generator)
    return ids, offsets, torch.randn(ids.numel(), generator=generator)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("scaled", [False, True])
@pytest.mark.parametrize("dim", [1, 13, 64])
def test_sums_equal_embedding_bag_on_the_widened_rows_bit_for_bit(dtype, scaled, dim):
    ids, offsets, scales = bags(dim)
    # Values over the float16 range, subnormals included.
    weight = (torch.randn(300, dim) * 10.0 ** torch.randint(-7, 4, (300, 1)).float()).to(dtype)

    per_id = scales if scaled else None

    pooled = pooled_half_rows(weight, ids, offsets, per_id)

    widened = weight.float()
    expected = F.embedding_bag(ids, widened, offsets, mode="sum", per_sample_weights=per_id, include_last_offset=True)
    assert pooled.dtype == torch.float32
    assert torch.equal(pooled, expected)


def test_an_id_outside_the_table_raises():
    weight = torch.zeros(10, 4, dtype=torch.float16)

    with pytest.raises(IndexError, match=r"in \[0, 10\), but 1 are not"):
        pooled_half_rows(weight, torch.tensor([3, 10, 2]), torch.tensor([0, 2, 3]), None)
