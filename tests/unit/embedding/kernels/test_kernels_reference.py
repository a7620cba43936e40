"""The reference step against torch's own optimizers, where their math is the same."""

import pytest
import torch

from embedding.kernels import fused_step
from embedding.optimizers import init_optimizer_state, sparse_optimizer_config
from embedding.optimizers.adagrad import AdagradConfig
from embedding.optimizers.adam import AdamConfig, AdamWConfig
from embedding.optimizers.rowwise_adagrad import RowwiseAdagradConfig
from embedding.optimizers.sgd import SGDConfig

NUM_ROWS, DIM = 30, 6


def random_batches(num_steps, ids_per_step=40, ids_high=NUM_ROWS):
    generator = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(num_steps):
        ids = torch.randint(0, ids_high, (ids_per_step,), generator=generator)
        grad_rows = torch.randn(10, DIM, generator=generator)
        grad_index = torch.randint(0, 10, (ids_per_step,), generator=generator)
        grad_scale = torch.rand(ids_per_step, generator=generator)
        batches.append((ids, grad_rows, grad_index, grad_scale))
    return batches


def summed_grad(ids, grad_rows, grad_index, grad_scale):
    """The gradient of the whole table, built the slow obvious way."""
    grad = torch.zeros(NUM_ROWS, DIM)
    for k in range(ids.numel()):
        grad[ids[k]] += grad_scale[k] * grad_rows[grad_index[k]]
    return grad


def test_adam_matches_sparse_adam_over_steps():
    config = AdamConfig(lr=0.05, beta1=0.8, beta2=0.95, eps=1e-6)
    weight = torch.randn(NUM_ROWS, DIM)
    state = init_optimizer_state(config, NUM_ROWS, DIM)
    param = torch.nn.Parameter(weight.clone())
    optimizer = torch.optim.SparseAdam([param], lr=0.05, betas=(0.8, 0.95), eps=1e-6)

    # Ids below NUM_ROWS // 2 only: the upper rows are never touched, and must not move.
    for step, batch in enumerate(random_batches(4, ids_high=NUM_ROWS // 2), start=1):
        fused_step(config, weight, state, *batch, step, backend="reference")
        grad = summed_grad(*batch)
        rows = batch[0].unique()
        param.grad = torch.sparse_coo_tensor(rows.unsqueeze(0), grad[rows], (NUM_ROWS, DIM), check_invariants=True)
        optimizer.step()

    torch.testing.assert_close(weight, param.detach(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(state["exp_avg"], optimizer.state[param]["exp_avg"].to_dense(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_sgd_matches_torch_sgd(weight_decay):
    config = SGDConfig(lr=0.1, weight_decay=weight_decay)
    weight = torch.randn(NUM_ROWS, DIM)
    param = torch.nn.Parameter(weight.clone())
    optimizer = torch.optim.SGD([param], lr=0.1, weight_decay=weight_decay)

    # With weight decay, dense SGD decays untouched rows too: only batches that touch every
    # row make it a lazy optimizer's equal.
    ids_per_step = 200 if weight_decay else 40
    for step, batch in enumerate(random_batches(3, ids_per_step), start=1):
        assert weight_decay == 0.0 or batch[0].unique().numel() == NUM_ROWS
        fused_step(config, weight, {}, *batch, step, backend="reference")
        param.grad = summed_grad(*batch)
        optimizer.step()

    torch.testing.assert_close(weight, param.detach(), rtol=1e-6, atol=1e-7)


def test_adagrad_matches_torch_adagrad():
    config = AdagradConfig(lr=0.1, eps=1e-6, initial_accumulator_value=0.2)
    weight = torch.randn(NUM_ROWS, DIM)
    state = init_optimizer_state(config, NUM_ROWS, DIM)
    param = torch.nn.Parameter(weight.clone())
    optimizer = torch.optim.Adagrad([param], lr=0.1, eps=1e-6, initial_accumulator_value=0.2)

    for step, batch in enumerate(random_batches(3), start=1):
        fused_step(config, weight, state, *batch, step, backend="reference")
        param.grad = summed_grad(*batch)
        optimizer.step()

    torch.testing.assert_close(weight, param.detach(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(state["sum"], optimizer.state[param]["sum"], rtol=1e-6, atol=1e-7)


def test_rowwise_adagrad_keeps_the_mean_squared_gradient_per_row():
    config = RowwiseAdagradConfig(lr=0.5, eps=1e-3, initial_accumulator_value=1.0)
    weight = torch.zeros(3, 2)
    state = init_optimizer_state(config, 3, 2)
    ids, grad_rows = torch.tensor([2, 0, 2]), torch.tensor([[1.0, 2.0], [3.0, 4.0]])

    fused_step(config, weight, state, ids, grad_rows, torch.tensor([0, 0, 1]), None, 1, backend="reference")

    # Row 2's gradient is [4, 6]; its mean square 26; row 0's is [1, 2], mean square 2.5.
    assert torch.equal(state["sum"], torch.tensor([3.5, 1.0, 27.0]))
    expected = torch.stack([-0.5 * torch.tensor([1.0, 2.0]) / (3.5**0.5 + 1e-3), torch.zeros(2)])
    expected = torch.cat([expected, (-0.5 * torch.tensor([4.0, 6.0]) / (27.0**0.5 + 1e-3)).unsqueeze(0)])
    torch.testing.assert_close(weight, expected)


def test_rowwise_adagrad_of_one_column_is_adagrad():
    batches = random_batches(3)
    tables = {}
    for name in ("rowwise_adagrad", "adagrad"):
        config = sparse_optimizer_config(name, lr=0.1, initial_accumulator_value=0.1)
        weight = torch.ones(NUM_ROWS, 1)
        state = init_optimizer_state(config, NUM_ROWS, 1)
        for step, (ids, grad_rows, grad_index, grad_scale) in enumerate(batches, start=1):
            one_column = grad_rows[:, :1].contiguous()
            fused_step(config, weight, state, ids, one_column, grad_index, grad_scale, step, backend="reference")
        tables[name] = weight

    torch.testing.assert_close(tables["rowwise_adagrad"], tables["adagrad"])


def test_adamw_decays_the_weight_apart_from_the_gradient():
    batch = random_batches(1)[0]
    adamw = AdamWConfig(lr=0.1, weight_decay=0.5)
    adam = AdamConfig(lr=0.1)
    weight = torch.randn(NUM_ROWS, DIM)
    decayed_then_adam = weight.clone()
    touched = batch[0].unique()
    decayed_then_adam[touched] *= 1 - 0.1 * 0.5

    fused_step(adamw, weight, init_optimizer_state(adamw, NUM_ROWS, DIM), *batch, 1, backend="reference")
    fused_step(adam, decayed_then_adam, init_optimizer_state(adam, NUM_ROWS, DIM), *batch, 1, backend="reference")

    torch.testing.assert_close(weight, decayed_then_adam)


@pytest.mark.parametrize("name", ["sgd", "adamw"])  # As an L2 penalty and decoupled: the same shrink here.
def test_weight_decay_by_frequency_divides_a_rows_decay_by_the_steps_that_touched_it(name):
    """With no gradient, the k-th step that touches a row shrinks it by lr * weight_decay / k; a row
    occurring three times in one step is touched once."""
    config = sparse_optimizer_config(name, lr=0.1, weight_decay=0.5, weight_decay_by_frequency=True)
    weight = torch.ones(NUM_ROWS, DIM)
    state = init_optimizer_state(config, NUM_ROWS, DIM)
    ids = torch.tensor([2, 2, 2, 5])
    expected = torch.ones(NUM_ROWS)
    for step_nr in range(1, 5):
        grads = (ids, torch.zeros(1, DIM), torch.zeros(4, dtype=torch.int64), None)
        fused_step(config, weight, state, *grads, step_nr, backend="reference")
        expected[[2, 5]] *= 1 - 0.1 * 0.5 / step_nr

    torch.testing.assert_close(weight[:, 0], expected)
    touches = torch.zeros(NUM_ROWS)
    touches[[2, 5]] = 4.0
    torch.testing.assert_close(state["touches"], touches)
