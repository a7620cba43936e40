"""The sparse optimizer config's checks, and the state each optimizer starts with."""

import pytest
import torch

from embedding.optim_config import (
    SparseOptimizerConfig,
    SparseOptimizerError,
    init_optimizer_state,
)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"name": "lamb"}, r"`name` must be one of sgd, rowwise_adagrad, adagrad, adam, adamw, but is 'lamb'"),
        ({"lr": -0.1}, r"`lr` must be greater than or equal to 0, but is -0.1"),
        ({"weight_decay": -1.0}, r"`weight_decay` must be greater than or equal to 0"),
        ({"eps": 0.0}, r"`eps` must be greater than 0, but is 0.0"),
        ({"beta1": 1.0}, r"`beta1` must be in \[0, 1\), but is 1.0"),
        ({"beta2": -0.5}, r"`beta2` must be in \[0, 1\), but is -0.5"),
        ({"initial_accumulator_value": -1.0}, r"`initial_accumulator_value` must be greater than or equal to 0"),
    ],
)
def test_rejects_invalid_fields(fields, message):
    with pytest.raises(SparseOptimizerError, match=message):
        SparseOptimizerConfig(**fields)


def test_config_error_is_a_value_error():
    assert issubclass(SparseOptimizerError, ValueError)


@pytest.mark.parametrize(
    ("name", "shapes"),
    [
        ("sgd", {}),
        ("rowwise_adagrad", {"sum": (7,)}),
        ("adagrad", {"sum": (7, 3)}),
        ("adam", {"exp_avg": (7, 3), "exp_avg_sq": (7, 3)}),
        ("adamw", {"exp_avg": (7, 3), "exp_avg_sq": (7, 3)}),
    ],
)
def test_state_has_one_tensor_per_statistic(name, shapes):
    state = init_optimizer_state(SparseOptimizerConfig(name, initial_accumulator_value=0.5), 7, 3)

    assert {key: tuple(t.shape) for key, t in state.items()} == shapes
    for key, tensor in state.items():
        assert tensor.dtype == torch.float32
        assert tensor.eq(0.5 if key == "sum" else 0.0).all()


def test_rejects_negative_sizes():
    with pytest.raises(SparseOptimizerError, match=r"`num_rows` and `dim` must be greater than or equal to 0"):
        init_optimizer_state(SparseOptimizerConfig(), -1, 3)
