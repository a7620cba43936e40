"""The fused step on float16 and bfloat16 rows: the CPU kernel against the reference, which rounds the same way;
deterministic; the optimizer state in float32; small updates kept in expectation."""

import numpy as np
import pytest
import torch

from embedding.kernels import RowKeys, fused_step
from embedding.optimizers import SPARSE_OPTIMIZERS, SparseOptimizerError, sparse_optimizer_config
from embedding.optimizers.sgd import SGDConfig

NUM_ROWS = 120
HALF_DTYPES = [torch.float16, torch.bfloat16]


def half_table(make_table, config, dtype, dim):
    table = make_table(config, NUM_ROWS, dim)
    table.weight = table.weight.to(dtype)
    return table


@pytest.mark.parametrize("name", SPARSE_OPTIMIZERS.names())
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("dim", [1, 5, 64])
def test_cpu_kernel_rounds_every_row_as_the_reference_does(
    name, dtype, dim, make_table, make_step_inputs, half_reference_check
):
    config = sparse_optimizer_config(name, lr=0.05, weight_decay=0.05)
    steps = [make_step_inputs(seed, NUM_ROWS, dim, 50, False, True) for seed in range(3)]

    half_reference_check(config, half_table(make_table, config, dtype, dim), steps, "cpu")


@pytest.mark.parametrize("name", ["rowwise_adagrad", "adam"])
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_rows_summed_in_another_order_round_to_the_same_or_a_neighbouring_value(
    name, dtype, make_table, make_step_inputs, steps_runner
):
    """Hot rows summed in the sorted order (the kernel) or by ``index_add_`` (the reference) differ in float32
    rounding, which moves a stochastic rounding by one value at most, and rarely."""
    config = sparse_optimizer_config(name, lr=0.05)
    steps = [make_step_inputs(seed, NUM_ROWS, 16, 400, True, True) for seed in range(2)]
    initial = half_table(make_table, config, dtype, 16)
    expected, actual = initial.clone(), initial.clone()

    steps_runner(config, expected, steps, "reference")
    steps_runner(config, actual, steps, "cpu")

    differ = actual.weight.view(torch.int16) != expected.weight.view(torch.int16)
    assert int(differ.sum()) <= differ.numel() // 50
    steps_apart = (actual.weight.view(torch.int16).int() - expected.weight.view(torch.int16).int()).abs()
    assert int(steps_apart.max()) <= 1


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_is_bitwise_deterministic_across_runs_and_thread_counts(dtype, make_table, make_step_inputs, determinism_check):
    config = sparse_optimizer_config("rowwise_adagrad", weight_decay=0.01)
    steps = [make_step_inputs(seed, 2000, 16, 5000, True, True) for seed in range(2)]
    table = make_table(config, 2000, 16)
    table.weight = table.weight.to(dtype)

    determinism_check(config, table, steps)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_updates_far_below_the_gap_between_values_move_rows_by_their_sum_in_expectation(dtype):
    """A thousand SGD steps of 1e-5 on rows of 1.0 (the gap above it: 2^-10 in float16, 2^-7 in bfloat16) would
    leave every row at 1.0 rounded to nearest; rounded stochastically, the rows' mean moves by the 0.01."""
    num_rows, steps = 2000, 1000
    weight = torch.ones(num_rows, 1, dtype=dtype)
    ids = torch.arange(num_rows)
    keys = RowKeys.of_buffer(num_rows, salt=5)
    for step in range(1, steps + 1):
        fused_step(
            SGDConfig(lr=1e-5), weight, {}, ids, torch.ones(1, 1), torch.zeros_like(ids), None, step, row_keys=keys
        )

    mean = float(weight.double().mean())
    assert mean == pytest.approx(1.0 - steps * 1e-5, abs=1.5e-3)


def test_rounding_draws_other_bits_for_another_key(make_step_inputs, make_table):
    config = sparse_optimizer_config("sgd", lr=0.05)
    inputs = make_step_inputs(0, NUM_ROWS, 32, 50, False, False)
    tables = [half_table(make_table, config, torch.bfloat16, 32) for _ in range(3)]
    for table, salt in zip(tables, (1, 1, 2)):
        args = (inputs.ids, inputs.grad_rows, inputs.grad_index, None, 1)
        fused_step(config, table.weight, table.state, *args, row_keys=RowKeys.of_buffer(NUM_ROWS, salt))

    assert torch.equal(tables[0].weight, tables[1].weight)
    assert not torch.equal(tables[0].weight, tables[2].weight)


def test_refuses_rows_of_another_dtype():
    weight = torch.zeros(4, 2, dtype=torch.float64)

    with pytest.raises(SparseOptimizerError, match=r"^`weight` must be of dtype torch.float32, torch.float16, "):
        fused_step(SGDConfig(), weight, {}, torch.tensor([1]), torch.ones(1, 2), torch.tensor([0]), None, 1)


def test_half_precision_rows_take_float32_gradients_only():
    weight = torch.zeros(4, 2, dtype=torch.float16)

    with pytest.raises(SparseOptimizerError, match=r"`grad_rows` must be of dtype torch.float32"):
        fused_step(SGDConfig(), weight, {}, torch.tensor([1]), torch.ones(1, 2).half(), torch.tensor([0]), None, 1)


def test_default_keys_are_the_buffer_rows_of_one_table_of_salt_zero(make_step_inputs, make_table):
    config = sparse_optimizer_config("adagrad", lr=0.05)
    inputs = make_step_inputs(1, NUM_ROWS, 8, 40, False, True)
    implicit, explicit = (half_table(make_table, config, torch.float16, 8) for _ in range(2))
    args = (inputs.ids, inputs.grad_rows, inputs.grad_index, inputs.grad_scale, 3)

    fused_step(config, implicit.weight, implicit.state, *args)
    keys = RowKeys(np.zeros(1, np.uint64), np.array([NUM_ROWS]), np.zeros(1, np.int64))
    fused_step(config, explicit.weight, explicit.state, *args, row_keys=keys)

    assert torch.equal(implicit.weight.view(torch.int16), explicit.weight.view(torch.int16))
