"""The dispatcher's choice of backend and its checks of the inputs."""

import pytest
import torch

from embedding.kernels import SortedIds, fused_step
from embedding.optimizers import SparseOptimizerError, init_optimizer_state
from embedding.optimizers.adam import AdamConfig

ADAM = AdamConfig()


def valid_args():
    """weight, state, ids, grad_rows, grad_index, grad_scale, step: a valid call to start from."""
    return {
        "weight": torch.zeros(10, 4),
        "state": init_optimizer_state(ADAM, 10, 4),
        "ids": torch.tensor([3, 9, 3]),
        "grad_rows": torch.ones(2, 4),
        "grad_index": torch.tensor([0, 1, 1]),
        "grad_scale": torch.ones(3),
        "step": 1,
    }


def call(**overrides):
    args = valid_args() | overrides
    fused_step(ADAM, **args)


def test_valid_call_updates_touched_rows_only():
    args = valid_args()
    fused_step(ADAM, **args)

    assert args["weight"][[3, 9]].ne(0).all()
    assert args["weight"][[0, 1, 2, 4, 5, 6, 7, 8]].eq(0).all()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"ids": torch.tensor([3, 10, 3])},
            r"`ids` must be in \[0, 10\) as there are 10 rows in `weight`, but contains 10",
        ),
        ({"ids": torch.tensor([3, -1, 3])}, r"`ids` must be in \[0, 10\) .* but contains -1"),
        ({"grad_index": torch.tensor([0, 2, 1])}, r"`grad_index` must be in \[0, 2\) .* but contains 2"),
        ({"ids": torch.tensor([3, 9, 3], dtype=torch.int32)}, r"`ids` must be of dtype torch.int64"),
        ({"ids": torch.tensor([[3, 9, 3]])}, r"`ids` must be 1-D"),
        ({"weight": torch.zeros(10, 4, dtype=torch.float64)}, r"`weight` must be of dtype torch.float32"),
        ({"weight": torch.zeros(4, 10).t()}, r"`weight` must be contiguous"),
        ({"weight": torch.zeros(10, 0)}, r"`weight` must have at least one column"),
        ({"grad_rows": torch.ones(2, 5)}, r"`grad_rows` must have the dimension of `weight` \(4\), but has 5"),
        (
            {"grad_rows": (torch.ones(1, 4), torch.ones(1, 5))},
            r"`grad_rows\[1\]` must have the dimension of `weight` \(4\), but has 5",
        ),
        ({"grad_rows": torch.ones(2, 8)[:, ::2]}, r"`grad_rows` must have contiguous rows, but has strides \(8, 2\)"),
        ({"grad_rows": ()}, r"`grad_rows` must hold at least one piece"),
        (
            {"grad_rows": (torch.ones(1, 4), torch.ones(1, 4)), "grad_index": torch.tensor([0, 2, 1])},
            r"`grad_index` must be in \[0, 2\) .* but contains 2",
        ),
        ({"grad_index": torch.tensor([0, 1])}, r"`grad_index` must have the shape of `ids` \(3,\)"),
        ({"grad_scale": torch.ones(4)}, r"`grad_scale` must have the shape of `ids` \(3,\)"),
        ({"step": 0}, r"`step` must be greater than or equal to 1, but is 0"),
        (
            {"state": {"sum": torch.zeros(10)}},
            r"`state` of optimizer 'adam' must have the keys \['exp_avg', 'exp_avg_sq'\]",
        ),
        (
            {"state": {"exp_avg": torch.zeros(10, 4), "exp_avg_sq": torch.zeros(9, 4)}},
            r"`state\['exp_avg_sq'\]` must have shape \(10, 4\), but has \(9, 4\)",
        ),
        (
            {"sorted_ids": SortedIds(torch.tensor([3.0, 3.0, 9.0]), torch.tensor([0, 2, 1]))},
            r"`sorted_ids.keys` must be of dtype torch.int32 or torch.int64, but is torch.float32",
        ),
        (
            {"sorted_ids": SortedIds(torch.tensor([3, 3, 9]), torch.tensor([0, 2, 1], dtype=torch.int32))},
            r"`sorted_ids.order` must be of dtype torch.int64",
        ),
        (
            {"sorted_ids": SortedIds(torch.tensor([3, 9]), torch.tensor([0, 1]))},
            r"`sorted_ids.keys` must have the shape of `ids` \(3,\), but has \(2,\)",
        ),
    ],
)
def test_rejects_invalid_inputs(overrides, message):
    with pytest.raises(SparseOptimizerError, match=message):
        call(**overrides)


def test_rejects_unknown_backend():
    with pytest.raises(SparseOptimizerError, match=r"`backend` must be one of reference, cpu, cuda, but is 'gpu'"):
        fused_step(ADAM, **valid_args(), backend="gpu")


@pytest.mark.parametrize("backend", [None, "reference", "cpu", "cuda"])
def test_empty_batch_changes_nothing(backend):
    args = valid_args() | {
        "ids": torch.empty(0, dtype=torch.int64),
        "grad_index": torch.empty(0, dtype=torch.int64),
        "grad_scale": None,
    }
    args["weight"].normal_()
    before = args["weight"].clone()

    fused_step(ADAM, **args, backend=backend)

    assert torch.equal(args["weight"], before)
    assert all(t.eq(0).all() for t in args["state"].values())


def test_cpu_tensors_go_to_the_cpu_kernel_by_default():
    default, cpu = valid_args(), valid_args()
    default["grad_rows"].normal_(generator=torch.Generator().manual_seed(0))
    cpu["grad_rows"].copy_(default["grad_rows"])

    fused_step(ADAM, **default)
    fused_step(ADAM, **cpu, backend="cpu")

    assert torch.equal(default["weight"], cpu["weight"])


@pytest.mark.parametrize("backend", ["reference", "cpu", "cuda"])
def test_every_backend_takes_a_sort_made_ahead_and_updates_as_without_it(backend):
    args, without = valid_args(), valid_args()
    sorted_ids = SortedIds.of(args["ids"], num_rows=10)

    fused_step(ADAM, **args, backend=backend, sorted_ids=sorted_ids)
    fused_step(ADAM, **without, backend=backend)

    assert torch.equal(args["weight"], without["weight"])
