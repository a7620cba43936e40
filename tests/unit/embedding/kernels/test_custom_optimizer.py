"""A sparse optimizer defined outside the embedding package, as a user's module would define one:
registered, it runs on every backend alike, and memory accounting and the state checks follow its
spec, with no other change anywhere.

Row-wise momentum: row-wise Adagrad's step size (one accumulator per row, fed the row's mean
squared gradient) drives a heavy-ball momentum buffer per element; weight decay is decoupled. It
keeps state of both kinds, so it takes every path of the kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import pytest
import torch
from numba.extending import register_jitable

from components import NonNegativeFloat, PositiveFloat, Range
from embedding import EmbeddingTableConfig, SparseOptimizerError
from embedding.kernels import fused_step
from embedding.memory import state_bytes
from embedding.optimizers import (
    DECOUPLED,
    SPARSE_OPTIMIZERS,
    OptimizerState,
    SparseOptimizerConfig,
    SparseOptimizerSpec,
    init_optimizer_state,
    sqrt,
)

NUM_ROWS = 60


@dataclass(frozen=True)
class RowwiseMomentumConfig(SparseOptimizerConfig):
    name: str = "rowwise_momentum"
    momentum: Annotated[float, Range(ge=0, lt=1)] = 0.9
    eps: PositiveFloat = 1e-8
    initial_accumulator_value: NonNegativeFloat = 0.0


@register_jitable
def update_row(states, mean_square, factors):
    (squares,) = states
    lr, _, eps = factors
    squares = squares + mean_square
    return (squares,), lr / (sqrt(squares) + eps)


@register_jitable
def update_element(weight, grad, row_multiplier, states, factors):
    (velocity,) = states
    _, momentum, _ = factors
    velocity = momentum * velocity + row_multiplier * grad
    return weight - velocity, (velocity,)


def rowwise_momentum(config: RowwiseMomentumConfig) -> SparseOptimizerSpec:
    return SparseOptimizerSpec(
        states=(
            OptimizerState("squares", per_row=True, initial_value=config.initial_accumulator_value),
            OptimizerState("velocity"),
        ),
        factors=lambda step, lr: (lr, config.momentum, config.eps),
        update_element=update_element,
        update_row=update_row,
        weight_decay=DECOUPLED,
    )


@pytest.fixture(autouse=True)
def registered(monkeypatch):
    """The optimizer registered for one test, as its module registers it for good on import
    (``@SPARSE_OPTIMIZERS.register("rowwise_momentum", RowwiseMomentumConfig)``); other tests
    never see it."""
    monkeypatch.setattr(SPARSE_OPTIMIZERS, "_components", dict(SPARSE_OPTIMIZERS._components))
    SPARSE_OPTIMIZERS.register("rowwise_momentum", RowwiseMomentumConfig)(rowwise_momentum)


@pytest.mark.parametrize(("backend", "dim"), [("cpu", 1), ("cpu", 16), ("cpu", 33), ("cuda", 5)])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_every_backend_applies_it_as_the_reference_does(backend, dim, weight_decay, make_step_inputs, reference_check):
    config = RowwiseMomentumConfig(lr=0.05, weight_decay=weight_decay, initial_accumulator_value=0.1)
    num_ids = 80 if backend == "cpu" else 20  # The simulator runs every GPU thread in Python.
    steps = [make_step_inputs(seed, NUM_ROWS, dim, num_ids, True, True) for seed in range(3)]

    reference_check(config, NUM_ROWS, dim, steps, backend)


def test_the_reference_steps_a_row_as_the_spec_says():
    config = RowwiseMomentumConfig(lr=0.5, momentum=0.5, eps=1e-3, weight_decay=0.1)
    weight = torch.ones(2, 2)
    state = init_optimizer_state(config, 2, 2)
    state["velocity"][1] = torch.tensor([1.0, -1.0])
    grad_rows = torch.tensor([[1.0, 2.0], [3.0, 4.0]])

    fused_step(
        config, weight, state, torch.tensor([1, 1]), grad_rows, torch.tensor([0, 1]), None, 1, backend="reference"
    )

    # Row 1's gradient is [4, 6], its mean square 26; the weight first shrinks by lr * weight_decay.
    velocity = 0.5 * torch.tensor([1.0, -1.0]) + 0.5 / (26.0**0.5 + 1e-3) * torch.tensor([4.0, 6.0])
    torch.testing.assert_close(state["squares"], torch.tensor([0.0, 26.0]))
    torch.testing.assert_close(state["velocity"][1], velocity)
    torch.testing.assert_close(weight, torch.stack([torch.ones(2), 0.95 - velocity]))


def test_the_cpu_kernel_is_bitwise_the_same_whatever_the_threads(make_step_inputs, make_table, determinism_check):
    config = RowwiseMomentumConfig(weight_decay=0.01)
    steps = [make_step_inputs(seed, 500, 16, 5000, True, True) for seed in range(2)]

    determinism_check(config, make_table(config, 500, 16), steps)


def test_memory_accounting_and_the_state_checks_follow_its_spec():
    config = RowwiseMomentumConfig(initial_accumulator_value=0.25)
    table = EmbeddingTableConfig("t", 10, 4, ("f",), optimizer=config)
    state = init_optimizer_state(config, 10, 4)
    args = (torch.tensor([2]), torch.ones(1, 4), torch.tensor([0]), None, 1)

    assert state_bytes(10, table.dim, config) == 10 * (1 + 4) * 4  # squares, velocity
    assert {name: tuple(tensor.shape) for name, tensor in state.items()} == {"squares": (10,), "velocity": (10, 4)}
    assert state["squares"].eq(0.25).all() and state["velocity"].eq(0).all()
    with pytest.raises(SparseOptimizerError, match=r"must have the keys \['squares', 'velocity'\], but has"):
        fused_step(config, torch.zeros(10, 4), {"squares": state["squares"]}, *args)
    with pytest.raises(SparseOptimizerError, match=r"`state\['squares'\]` must be 1-D, but has shape \(10, 4\)"):
        fused_step(config, torch.zeros(10, 4), {"squares": torch.zeros(10, 4), "velocity": state["velocity"]}, *args)


def test_its_config_checks_its_own_options():
    with pytest.raises(
        SparseOptimizerError,
        match=r"`momentum` of sparse optimizer 'rowwise_momentum' must be a finite number in \[0, 1\), but is 1.0",
    ):
        RowwiseMomentumConfig(momentum=1.0)
