import pytest
import torch

from embedding.lookup import Bags


@pytest.mark.parametrize(
    ("lengths", "expected"),
    [
        ([1, 1, 1], [0, 1, 2]),  # one id per bag
        ([0, 2, 1], [1, 1, 2]),  # as many bags as ids, but not one each
        ([2, 0, 3], [0, 0, 2, 2, 2]),
        ([0, 0], []),
    ],
)
def test_bag_of_each_id(lengths: list[int], expected: list[int]) -> None:
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    bags = Bags(torch.arange(sum(lengths)), offsets, None)

    assert bags.bag_of_each_id().tolist() == expected
