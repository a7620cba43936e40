"""The numba.cuda kernel against the torch reference: under the CUDA simulator on CPU (tiny sizes:
the simulator runs every GPU thread as a Python thread), or on a GPU with
``NUMBA_ENABLE_CUDASIM=0 pytest tests/unit/embedding/kernels/test_kernels_cuda.py``."""

import pytest
import torch

from embedding.kernels import cuda, fused_step
from embedding.optimizers import SPARSE_OPTIMIZERS, SparseOptimizerError, sparse_optimizer_config
from embedding.optimizers.rowwise_adagrad import RowwiseAdagradConfig

NUM_ROWS = 50


@pytest.mark.parametrize("name", SPARSE_OPTIMIZERS.names())
@pytest.mark.parametrize(
    ("dim", "duplicates", "with_scale", "weight_decay"), [(3, True, True, 0.05), (5, False, False, 0.0)]
)
def test_matches_reference_over_steps(
    name, dim, duplicates, with_scale, weight_decay, make_step_inputs, reference_check
):
    config = sparse_optimizer_config(name, lr=0.05, weight_decay=weight_decay)
    steps = [make_step_inputs(seed, NUM_ROWS, dim, 20, duplicates, with_scale) for seed in range(2)]

    reference_check(config, NUM_ROWS, dim, steps, "cuda")


@pytest.mark.parametrize("name", ["rowwise_adagrad", "adam"])
def test_matches_reference_on_empty_and_single_id_batches(name, make_step_inputs, reference_check):
    config = sparse_optimizer_config(name, weight_decay=0.01)
    steps = [make_step_inputs(0, NUM_ROWS, 4, 0, False, True), make_step_inputs(1, NUM_ROWS, 4, 1, False, True)]

    reference_check(config, NUM_ROWS, 4, steps, "cuda")


@pytest.mark.parametrize("name", ["sgd", "rowwise_adagrad", "adam"])
def test_a_row_looked_up_more_than_a_chunk_sums_its_chunks_like_the_reference(name, make_step_inputs, reference_check):
    """Rows looked up 600 and 257 times are summed in units of at most 256 first, each unit's sum
    then added in order by the long rows' kernel."""
    steps = [make_step_inputs(seed, NUM_ROWS, 4, 30, False, True) for seed in range(2)]
    for inputs, (row, times) in zip(steps, [(3, 600), (7, 257)]):
        hot = torch.full((times,), row)
        inputs.ids = torch.cat([inputs.ids, hot, torch.full((256,), 11)])
        extra = inputs.ids.numel() - inputs.grad_index.numel()
        inputs.grad_index = torch.cat([inputs.grad_index, torch.randint(0, inputs.grad_rows.size(0), (extra,))])
        inputs.grad_scale = torch.cat([inputs.grad_scale, torch.rand(extra)])

    reference_check(sparse_optimizer_config(name, lr=0.05), NUM_ROWS, 4, steps, "cuda")


def test_rowwise_adagrad_sums_a_row_wider_than_a_warp_like_the_reference(make_step_inputs, reference_check):
    """300 elements over a warp's 32 lanes: ten a lane (the last ones' tenth past the row, left out) before the
    lanes' sums are added."""
    steps = [make_step_inputs(0, NUM_ROWS, 300, 6, True, True)]
    reference_check(RowwiseAdagradConfig(lr=0.05), NUM_ROWS, 300, steps, "cuda")


@pytest.mark.parametrize("name", ["sgd", "rowwise_adagrad", "adamw"])
def test_matches_reference_with_weight_decay_by_frequency(name, make_step_inputs, reference_check):
    config = sparse_optimizer_config(name, lr=0.05, weight_decay=0.05, weight_decay_by_frequency=True)
    steps = [make_step_inputs(seed, NUM_ROWS, 3, 20, True, True) for seed in range(2)]

    reference_check(config, NUM_ROWS, 3, steps, "cuda")


@pytest.mark.parametrize("name", ["sgd", "rowwise_adagrad", "adamw"])
def test_rows_cut_at_every_chunk_boundary_match_the_reference_with_the_same_bits_each_run(
    name, make_step_inputs, make_table, steps_runner, reference_check, device_of
):
    """1,500 ids: one row spanning four boundaries of 256 sorted positions, and short rows that
    straddle one; every row's units add up as the reference does, and a second run gives the very
    same bits (no atomics)."""
    config = sparse_optimizer_config(name, lr=0.05, weight_decay=0.01, weight_decay_by_frequency=True)
    inputs = make_step_inputs(0, NUM_ROWS, 6, 1500, True, True)
    generator = torch.Generator().manual_seed(0)
    inputs.ids = torch.randint(0, NUM_ROWS // 2, (1500,), generator=generator)
    inputs.ids[torch.randperm(1500, generator=generator)[:1000]] = 7

    first = reference_check(config, NUM_ROWS, 6, [inputs], "cuda")
    second = make_table(config, NUM_ROWS, 6).to(device_of("cuda"))  # The table the first run started from.
    steps_runner(config, second, [inputs], "cuda")
    second = second.to(torch.device("cpu"))
    assert torch.equal(first.weight, second.weight)
    assert all(torch.equal(first.state[key], second.state[key]) for key in first.state)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"ids": [3, 50, 3]}, r"`ids` must be in \[0, 50\) as there are 50 rows in `weight`, but contains 50"),
        ({"ids": [3, -1, 3]}, r"`ids` must be in \[0, 50\) .* but contains -1"),
        ({"grad_index": [0, 3, 1]}, r"`grad_index` must be in \[0, 3\) .* but contains 3"),
    ],
)
def test_ids_out_of_range_raise_and_leave_every_row_as_it_was(bad, message, make_table, device_of):
    """The step reads the ids' range only once its kernels are queued; they read it first and write nothing."""
    config = sparse_optimizer_config("adam", lr=0.05)
    device = device_of("cuda")
    table = make_table(config, NUM_ROWS, 4).to(device)
    before = table.clone()
    inputs = {"ids": [3, 7, 3], "grad_index": [0, 1, 2]} | bad

    with pytest.raises(SparseOptimizerError, match=message):
        fused_step(
            config, table.weight, table.state, torch.tensor(inputs["ids"], device=device),
            torch.ones(3, 4, device=device), torch.tensor(inputs["grad_index"], device=device), None, 1,
            backend="cuda",
        )  # fmt: skip

    assert torch.equal(table.weight, before.weight)
    assert all(torch.equal(table.state[key], before.state[key]) for key in table.state)


def test_steps_of_growing_and_shrinking_batches_reuse_and_grow_the_workspace_like_the_reference(
    make_step_inputs, reference_check
):
    """The step's buffers are kept between steps and made anew, larger, for a batch with more ids than any before:
    a batch after a larger one, and one larger than every one before, both sum as the reference does."""
    cuda._WORKSPACES.clear()
    steps = [make_step_inputs(seed, NUM_ROWS, 4, size, True, True) for seed, size in enumerate([40, 7, 300, 12])]

    reference_check(sparse_optimizer_config("rowwise_adagrad", lr=0.05), NUM_ROWS, 4, steps, "cuda")
    (space,) = cuda._WORKSPACES.values()
    assert space.capacity == 300
