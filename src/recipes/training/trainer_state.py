"""What a checkpoint of a training run holds, in one place: gathered from the parts that hold it, and put back.

A resume must continue as if the run had never stopped, so everything a step reads or changes is
here: the model, the optimizers (dense and sparse), the LR scheduler, the loss scaler, the
Trainer's counters and the validator's memory (shared by every rank, written once), and each
rank's data position, RNG streams, unreduced metrics and shards of the sparse tables.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from recipes.runtime.rng import rng_state, set_rng_state
from recipes.training.data_reader import DataReader
from recipes.training.parallel import load_model_state, load_optimizer_state, model_state, optimizer_state
from recipes.training.protocols import ShardedStateful, TracksChangedRows
from recipes.training.validator import Validator
from units import MetricBag


@dataclass
class TrainerCounters:
    """Where the Trainer is: what it counts, and what the last validation concluded."""

    step_nr: int = 0
    data_epoch_nr: int = 0
    num_consecutive_skipped: int = 0
    last_score: float | None = None
    best_score: float | None = None
    """The best validation score so far, which a new best must beat to be checkpointed at once."""
    early_stopped: bool = False


@dataclass
class TrainingState:
    """The stateful parts of a training run; ``shared()`` and ``per_rank()`` are what a checkpoint writes."""

    model: nn.Module
    optimizer: Optimizer
    lr_scheduler: LRScheduler
    grad_scaler: torch.amp.GradScaler
    counters: TrainerCounters
    validator: Validator
    reader: DataReader[Any]
    metrics: MetricBag
    """The Trainer's own metrics (loss, throughput...), unreduced: each rank keeps its share."""
    unit_metrics: MetricBag
    sharded: Mapping[str, ShardedStateful]

    def shared(self) -> dict[str, Any]:
        """What is the same on every rank: written once per checkpoint (a collective under FSDP2 or TP)."""
        return {
            "model": model_state(self.model),
            "optimizer": optimizer_state(self.model, self.optimizer),
            "lr_scheduler": self.lr_scheduler.state_dict(),
            "grad_scaler": self.grad_scaler.state_dict(),
            "trainer": dataclasses.asdict(self.counters),
            "early_stopper": self.validator.state_dict(),
        }

    def per_rank(self, delta_of: int | None = None) -> dict[str, Any]:
        """What differs between ranks: the data position, RNG streams, unreduced metrics and shards; with
        ``delta_of``, the shards that track their changed rows as a delta over that step's checkpoint, else whole
        (and their changes counted from now)."""
        return {
            "data_reader": self.reader.state_dict(),
            "metrics": self.metrics.state_dict(),
            "unit_metrics": self.unit_metrics.state_dict(),
            "rng": rng_state(),
            "sharded": {name: _sharded_state(stateful, delta_of) for name, stateful in self.sharded.items()},
        }

    def load_shared(self, state: Mapping[str, Any]) -> None:
        load_model_state(self.model, state["model"])
        load_optimizer_state(self.model, self.optimizer, state["optimizer"])
        self.lr_scheduler.load_state_dict(state["lr_scheduler"])
        self.grad_scaler.load_state_dict(state["grad_scaler"])
        self.counters = TrainerCounters(**state["trainer"])
        self.validator.load_state_dict(state["early_stopper"])

    def load_per_rank(self, state: Mapping[str, Any], all_ranks: Sequence[Mapping[str, Any]]) -> None:
        """Load this rank's ``state``; the sparse shards are rebuilt from the states of ``all_ranks`` that saved."""
        self.reader.load_state_dict(state["data_reader"])
        self.metrics.load_state_dict(state["metrics"])
        self.unit_metrics.load_state_dict(state["unit_metrics"])
        set_rng_state(state["rng"])
        load_sharded_state(self.sharded, all_ranks)


def _sharded_state(stateful: ShardedStateful, delta_of: int | None) -> dict[str, Any]:
    if not isinstance(stateful, TracksChangedRows):
        return stateful.sharded_state_dict()
    if delta_of is not None:
        return stateful.delta_state_dict(delta_of)
    state = stateful.sharded_state_dict()
    stateful.forget_changes()
    return state


def load_sharded_state(sharded: Mapping[str, ShardedStateful], all_ranks: Sequence[Mapping[str, Any]]) -> None:
    """Rebuild this rank's sharded state (sparse tables) from the rank states of a saving job."""
    for name, stateful in sharded.items():
        stateful.load_sharded_state_dict([rank_state["sharded"][name] for rank_state in all_ranks])
