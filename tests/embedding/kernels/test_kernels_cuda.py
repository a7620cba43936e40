"""The numba.cuda kernel against the torch reference: under the CUDA simulator on CPU (tiny sizes:
the simulator runs every GPU thread as a Python thread), or on a GPU with
``NUMBA_ENABLE_CUDASIM=0 pytest tests/embedding/kernels/test_kernels_cuda.py``."""

import pytest

from embedding.optim_config import SPARSE_OPTIMIZERS, SparseOptimizerConfig

NUM_ROWS = 50


@pytest.mark.parametrize("name", SPARSE_OPTIMIZERS)
@pytest.mark.parametrize(
    ("dim", "duplicates", "with_scale", "weight_decay"), [(3, True, True, 0.05), (5, False, False, 0.0)]
)
def test_matches_reference_over_steps(
    name, dim, duplicates, with_scale, weight_decay, make_step_inputs, reference_check
):
    config = SparseOptimizerConfig(name, lr=0.05, weight_decay=weight_decay)
    steps = [make_step_inputs(seed, NUM_ROWS, dim, 20, duplicates, with_scale) for seed in range(2)]

    reference_check(config, NUM_ROWS, dim, steps, "cuda")


@pytest.mark.parametrize("name", ["rowwise_adagrad", "adam"])
def test_matches_reference_on_empty_and_single_id_batches(name, make_step_inputs, reference_check):
    config = SparseOptimizerConfig(name, weight_decay=0.01)
    steps = [make_step_inputs(0, NUM_ROWS, 4, 0, False, True), make_step_inputs(1, NUM_ROWS, 4, 1, False, True)]

    reference_check(config, NUM_ROWS, 4, steps, "cuda")
