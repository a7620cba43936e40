"""The sparse optimizer configs' checks, and the state each optimizer starts with."""

import pytest
import torch

from embedding.optimizers import (
    SparseOptimizerConfig,
    SparseOptimizerError,
    init_optimizer_state,
    sparse_optimizer_config,
)
from embedding.optimizers.adagrad import AdagradConfig
from embedding.optimizers.adam import AdamConfig, AdamWConfig
from embedding.optimizers.rowwise_adagrad import RowwiseAdagradConfig
from embedding.optimizers.sgd import SGDConfig


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: SparseOptimizerConfig(name="lamb"),
            r"The sparse optimizer must be one of adagrad, adam, adamw, rowwise_adagrad, sgd, but is 'lamb'",
        ),
        (lambda: SGDConfig(lr=-0.1), r"`lr` of sparse optimizer '\w+' must be a finite number >= 0, but is -0.1"),
        (
            lambda: AdamWConfig(weight_decay=-1.0),
            r"`weight_decay` of sparse optimizer '\w+' must be a finite number >= 0",
        ),
        (lambda: AdagradConfig(eps=0.0), r"`eps` of sparse optimizer '\w+' must be a finite number > 0, but is 0.0"),
        (
            lambda: AdamConfig(beta1=1.0),
            r"`beta1` of sparse optimizer '\w+' must be a finite number in \[0, 1\), but is 1.0",
        ),
        (
            lambda: AdamConfig(beta2=-0.5),
            r"`beta2` of sparse optimizer '\w+' must be a finite number in \[0, 1\), but is -0.5",
        ),
        (
            lambda: RowwiseAdagradConfig(initial_accumulator_value=-1.0),
            r"`initial_accumulator_value` of sparse optimizer '\w+' must be a",
        ),
        (
            lambda: SGDConfig(lr=float("nan")),
            r"`lr` of sparse optimizer '\w+' must be a finite number >= 0, but is nan",
        ),
        (
            lambda: AdamConfig(name="adamw"),
            r"The config of sparse optimizer 'adamw' must be of class AdamWConfig, but is of class AdamConfig",
        ),
        (
            lambda: SparseOptimizerConfig(name="sgd"),
            r"must be of class SGDConfig, but is of class SparseOptimizerConfig",
        ),
        (
            lambda: RowwiseAdagradConfig(weight_decay_by_frequency=True),
            r"`weight_decay` must be greater than 0 when `weight_decay_by_frequency` is set, but is 0",
        ),
    ],
)
def test_rejects_invalid_fields(make, message):
    with pytest.raises(SparseOptimizerError, match=message):
        make()


def test_config_error_is_a_value_error():
    assert issubclass(SparseOptimizerError, ValueError)


def test_a_config_by_name_takes_only_its_optimizers_options():
    assert sparse_optimizer_config("adamw", beta1=0.8) == AdamWConfig(beta1=0.8)
    with pytest.raises(TypeError, match="beta1"):
        sparse_optimizer_config("sgd", beta1=0.8)
    with pytest.raises(SparseOptimizerError, match="`name` must be one of"):
        sparse_optimizer_config("lamb")


@pytest.mark.parametrize(
    ("config", "shapes", "initial"),
    [
        (SGDConfig(), {}, 0.0),
        (SGDConfig(weight_decay=0.1, weight_decay_by_frequency=True), {"touches": (7,)}, 0.0),
        (RowwiseAdagradConfig(initial_accumulator_value=0.5), {"sum": (7,)}, 0.5),
        (AdagradConfig(initial_accumulator_value=0.5), {"sum": (7, 3)}, 0.5),
        (AdamConfig(), {"exp_avg": (7, 3), "exp_avg_sq": (7, 3)}, 0.0),
        (AdamWConfig(), {"exp_avg": (7, 3), "exp_avg_sq": (7, 3)}, 0.0),
    ],
)
def test_state_has_one_tensor_per_statistic(config, shapes, initial):
    state = init_optimizer_state(config, 7, 3)

    assert {key: tuple(t.shape) for key, t in state.items()} == shapes
    for tensor in state.values():
        assert tensor.dtype == torch.float32
        assert tensor.eq(initial).all()


def test_rejects_negative_sizes():
    with pytest.raises(SparseOptimizerError, match=r"`num_rows` and `dim` must be greater than or equal to 0"):
        init_optimizer_state(RowwiseAdagradConfig(), -1, 3)
