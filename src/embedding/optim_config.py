"""The sparse optimizers that update embedding tables, and the state each one keeps per row."""

from __future__ import annotations

from dataclasses import dataclass

import torch

SPARSE_OPTIMIZERS = ("sgd", "rowwise_adagrad", "adagrad", "adam", "adamw")


class SparseOptimizerError(ValueError):
    """Raised when a sparse optimizer is configured or called with invalid values."""


@dataclass(frozen=True)
class SparseOptimizerConfig:
    """The optimizer of an embedding table, applied lazily: rows not touched in a step keep
    their weight and state unchanged.

    ``weight_decay`` is an L2 penalty added to the gradient for every optimizer but ``adamw``,
    where it is decoupled from the gradient as in ``torch.optim.AdamW``.
    """

    name: str = "rowwise_adagrad"
    lr: float = 0.01
    weight_decay: float = 0.0
    eps: float = 1e-8
    beta1: float = 0.9
    beta2: float = 0.999
    initial_accumulator_value: float = 0.0

    def __post_init__(self) -> None:
        if self.name not in SPARSE_OPTIMIZERS:
            raise SparseOptimizerError(
                f"`name` must be one of {', '.join(SPARSE_OPTIMIZERS)}, but is '{self.name}' instead."
            )
        if self.lr < 0.0:
            raise SparseOptimizerError(f"`lr` must be greater than or equal to 0, but is {self.lr} instead.")
        if self.weight_decay < 0.0:
            raise SparseOptimizerError(
                f"`weight_decay` must be greater than or equal to 0, but is {self.weight_decay} instead."
            )
        if self.eps <= 0.0:
            raise SparseOptimizerError(f"`eps` must be greater than 0, but is {self.eps} instead.")
        for field_name, beta in (("beta1", self.beta1), ("beta2", self.beta2)):
            if not 0.0 <= beta < 1.0:
                raise SparseOptimizerError(f"`{field_name}` must be in [0, 1), but is {beta} instead.")
        if self.initial_accumulator_value < 0.0:
            raise SparseOptimizerError(
                "`initial_accumulator_value` must be greater than or equal to 0, but is "
                f"{self.initial_accumulator_value} instead."
            )


def init_optimizer_state(
    config: SparseOptimizerConfig,
    num_rows: int,
    dim: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> dict[str, torch.Tensor]:
    """Return the fresh optimizer state of a ``[num_rows, dim]`` table, by state name.

    Row-wise Adagrad keeps one accumulator per row (FBGEMM's choice), which is what makes it
    the cheap default for large tables; Adagrad keeps one per element, Adam two.
    """
    if num_rows < 0 or dim < 0:
        raise SparseOptimizerError(
            f"`num_rows` and `dim` must be greater than or equal to 0, but are {num_rows} and {dim} instead."
        )

    if config.name == "sgd":
        return {}
    if config.name == "rowwise_adagrad":
        return {"sum": torch.full((num_rows,), config.initial_accumulator_value, dtype=dtype, device=device)}
    if config.name == "adagrad":
        return {"sum": torch.full((num_rows, dim), config.initial_accumulator_value, dtype=dtype, device=device)}
    # adam and adamw
    return {
        "exp_avg": torch.zeros((num_rows, dim), dtype=dtype, device=device),
        "exp_avg_sq": torch.zeros((num_rows, dim), dtype=dtype, device=device),
    }
