"""FakeGang: the gang of one process, whose collectives are the identity."""

from __future__ import annotations

import pytest
import torch

from gang import FakeGang, GangError, ReduceOperation


def test_is_rank_0_of_1_on_its_device() -> None:
    gang = FakeGang("cpu")

    assert (gang.rank, gang.size, gang.device) == (0, 1, torch.device("cpu"))
    assert repr(gang) == "FakeGang(rank=0, size=1, device=cpu)"


@pytest.mark.parametrize("op", list(ReduceOperation))
def test_all_reduce_leaves_the_tensor_as_is(op: ReduceOperation) -> None:
    tensor = torch.tensor([1.5, -2.0, 3.0])

    FakeGang().all_reduce(tensor, op)

    assert torch.equal(tensor, torch.tensor([1.5, -2.0, 3.0]))


def test_all_gather_gives_a_leading_dimension_of_one() -> None:
    input = torch.arange(6.0).view(2, 3)
    output = torch.empty(1, 2, 3)

    FakeGang().all_gather(output, input)

    assert torch.equal(output[0], input)


def test_a_started_all_gather_is_done_when_it_returns() -> None:
    input = torch.arange(4)
    output = torch.empty(1, 4, dtype=torch.int64)

    FakeGang().start_all_gather(output, input).wait()

    assert torch.equal(output[0], input)


def test_all_to_all_copies_the_input() -> None:
    input = torch.arange(5.0)
    output = torch.zeros(5)

    FakeGang().all_to_all(output, input, [5], [5])

    assert torch.equal(output, input)


def test_broadcast_keeps_the_tensor_and_checks_the_source_rank() -> None:
    gang = FakeGang()
    tensor = torch.tensor([7.0])

    gang.broadcast(tensor, source_rank=0)

    assert torch.equal(tensor, torch.tensor([7.0]))
    with pytest.raises(ValueError, match=r"`rank` must be in \[0, 1\), but is 1 instead"):
        gang.broadcast(tensor, source_rank=1)


def test_object_collectives_return_the_own_object() -> None:
    gang = FakeGang()
    obj = {"a": [1, 2]}

    assert gang.all_gather_object(obj) == [obj]
    assert gang.broadcast_object(obj) is obj


def test_make_gang_of_rank_0_is_itself_and_of_no_rank_is_none() -> None:
    gang = FakeGang()

    assert gang.make_gang([0]) is gang
    assert gang.make_gang([]) is None
    with pytest.raises(ValueError, match="`rank` must be in"):
        gang.make_gang([1])


def test_as_process_group_raises_gang_error() -> None:
    with pytest.raises(GangError, match="no process group"):
        FakeGang().as_process_group()


def test_barrier_and_close_are_harmless() -> None:
    gang = FakeGang()

    gang.barrier()
    gang.close()
