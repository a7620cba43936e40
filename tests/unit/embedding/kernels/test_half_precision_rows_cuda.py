"""The numba.cuda kernels on float16 and bfloat16 rows against the reference, which rounds the same way: under the
CUDA simulator on CPU (tiny sizes), or on a GPU with ``NUMBA_ENABLE_CUDASIM=0``."""

import pytest
import torch

from embedding.kernels import RowKeys, fused_step
from embedding.optimizers import sparse_optimizer_config

NUM_ROWS = 40

# The simulator runs the compiled hashes as numpy scalars, whose wrapping multiplications numpy warns of.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")


def run_both(config, make_table, device_of, steps_runner, steps, dtype, dim):
    """The reference's table and the CUDA backend's, after ``steps`` from the same half-precision table."""
    initial = make_table(config, NUM_ROWS, dim)
    initial.weight = initial.weight.to(dtype)
    expected, actual = initial.clone(), initial.clone().to(device_of("cuda"))
    steps_runner(config, expected, steps, "reference")
    steps_runner(config, actual, steps, "cuda")
    return expected, actual.to(torch.device("cpu"))


@pytest.mark.parametrize("name", ["sgd", "rowwise_adagrad", "adam"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rows_round_as_the_references(name, dtype, make_table, make_step_inputs, half_reference_check):
    config = sparse_optimizer_config(name, lr=0.05, weight_decay=0.05)
    steps = [make_step_inputs(seed, NUM_ROWS, 5, 12, False, True) for seed in range(2)]
    table = make_table(config, NUM_ROWS, 5)
    table.weight = table.weight.to(dtype)

    half_reference_check(config, table, steps, "cuda")


@pytest.mark.parametrize("name", ["sgd", "rowwise_adagrad"])
def test_a_long_row_is_rounded_once_by_the_long_rows_kernel(
    name, make_table, make_step_inputs, device_of, steps_runner
):
    """A row looked up 300 times (two units, added by the long rows' kernel): its weights decayed, updated and
    rounded once, as the reference does; the sums' order moves a rounding by one value at most."""
    config = sparse_optimizer_config(name, lr=0.05, weight_decay=0.05)
    inputs = make_step_inputs(0, NUM_ROWS, 3, 4, False, True)
    hot = torch.full((300,), 9)
    inputs.ids = torch.cat([inputs.ids, hot])
    inputs.grad_index = torch.cat([inputs.grad_index, torch.zeros(300, dtype=torch.int64)])
    inputs.grad_scale = torch.cat([inputs.grad_scale, torch.full((300,), 0.25)])  # exact sums in any order

    expected, actual = run_both(config, make_table, device_of, steps_runner, [inputs], torch.bfloat16, 3)

    assert torch.equal(actual.weight.view(torch.int16), expected.weight.view(torch.int16))


def test_the_keys_given_reach_the_kernels(make_table, make_step_inputs, device_of):
    config = sparse_optimizer_config("sgd", lr=0.05)
    inputs = make_step_inputs(1, NUM_ROWS, 4, 10, False, False)
    keys = RowKeys.of_buffer(NUM_ROWS, salt=77)
    weights = []
    for backend in ("reference", "cuda"):
        device = device_of(backend)
        weight = make_table(config, NUM_ROWS, 4).weight.to(torch.float16).to(device)
        ids, grad_rows, grad_index = inputs.ids.to(device), inputs.grad_rows.to(device), inputs.grad_index.to(device)
        fused_step(config, weight, {}, ids, grad_rows, grad_index, None, 3, backend=backend, row_keys=keys)
        weights.append(weight.cpu())

    assert torch.equal(weights[0].view(torch.int16), weights[1].view(torch.int16))
