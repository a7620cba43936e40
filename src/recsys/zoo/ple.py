"""PLE: Progressive Layered Extraction (Tang et al., Progressive Layered Extraction (PLE): A Novel Multi-Task
Learning (MTL) Model for Personalized Recommendations, RecSys 2020).

MMoE's gates may still mix every expert into every task, so that conflicting tasks keep pulling on the same ones
(the paper's "seesaw": one task gains what the other loses). PLE gives each task experts of its own besides the
shared ones: a Customized Gate Control (CGC) layer's gate of a task mixes only that task's experts and the shared
experts, so a task's own experts learn what the others must not move. ``num_levels`` CGC layers are stacked: at
each level but the last a shared gate also mixes every expert into the next level's shared input, and each task's
experts read that task's mixture of the level below. A tower per task reads its task's last mixture.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from components import PositiveInt
from recsys.click.models import Pooled
from recsys.zoo.multitask import ConcatenatedModel, Expert, ExpertsConfig, Gate, Towers, expert_plan, input_width
from recsys.zoo.zoo_model import ZOO_MODELS, ModelInputs

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle


@dataclass
class PLEConfig(ExpertsConfig):
    """PLE's options; the defaults: 2 levels, each with 2 experts per task and 2 shared, of (256, 128)."""

    num_levels: PositiveInt = 2
    """The CGC layers stacked (the paper's 1 is CGC alone; it finds 2 better on its data)."""
    num_task_experts: PositiveInt = 2
    """Each task's own experts at every level."""
    num_shared_experts: PositiveInt = 2
    """The experts every task's gate mixes, at every level."""


def experts(in_dim: int, count: int, config: PLEConfig) -> nn.ModuleList:
    return nn.ModuleList(Expert(in_dim, config.expert_dims, config.dropout) for _ in range(count))


class CGCLayer(nn.Module):
    """One level: each task's experts and the shared experts; each task's gate over its own and the shared experts;
    with ``shared_gate``, a gate over every expert for the shared input of the level above."""

    def __init__(self, in_dim: int, config: PLEConfig, num_tasks: int, shared_gate: bool) -> None:
        super().__init__()
        own, shared = config.num_task_experts, config.num_shared_experts
        self.task_experts = nn.ModuleList(experts(in_dim, own, config) for _ in range(num_tasks))
        self.shared_experts = experts(in_dim, shared, config)
        self.task_gates = nn.ModuleList(Gate(in_dim, config.gate_dims, own + shared) for _ in range(num_tasks))
        self.shared_gate = Gate(in_dim, config.gate_dims, num_tasks * own + shared) if shared_gate else None

    def tensor_parallel_plan(self, prefix: str) -> dict[str, ParallelStyle]:
        groups = {f"task_experts.{t}": group for t, group in enumerate(self.task_experts)}
        groups["shared_experts"] = self.shared_experts
        return {
            name: style
            for group_name, group in groups.items()
            for e, expert in enumerate(group.children())
            for name, style in expert_plan(expert, f"{prefix}.{group_name}.{e}").items()
        }

    def forward(
        self, task_inputs: list[torch.Tensor], shared_input: torch.Tensor
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Each task's mixture and the shared mixture (the shared input as it came, at the last level)."""
        shared = [expert(shared_input) for expert in self.shared_experts]
        groups = [group.children() for group in self.task_experts]
        own = [[expert(x) for expert in group] for group, x in zip(groups, task_inputs, strict=True)]
        mixed = [
            gate(x, torch.stack([*experts_of_task, *shared], dim=1))
            for gate, x, experts_of_task in zip(self.task_gates, task_inputs, own, strict=True)
        ]
        if self.shared_gate is None:
            return mixed, shared_input
        every = torch.stack([*(expert for group in own for expert in group), *shared], dim=1)
        return mixed, self.shared_gate(shared_input, every)


class PLE(ConcatenatedModel):
    """``num_levels`` CGC layers over the input, then a tower per task over its last mixture."""

    def __init__(
        self, embeddings: nn.Module, features: list[str], num_dense: int, width: int, config: PLEConfig, num_tasks: int
    ) -> None:
        super().__init__(embeddings, features, num_dense)
        out = config.expert_dims[-1]
        self.levels = nn.ModuleList(
            CGCLayer(width if level == 0 else out, config, num_tasks, shared_gate=level < config.num_levels - 1)
            for level in range(config.num_levels)
        )
        self.towers = Towers(out, config.tower_dims, num_tasks, config.dropout)
        self.num_tasks = num_tasks

    def tensor_parallel_plan(self) -> dict[str, ParallelStyle]:
        plan: dict[str, ParallelStyle] = {}
        for level, layer in enumerate(self.levels):
            plan.update(layer.tensor_parallel_plan(f"levels.{level}"))  # type: ignore[operator]
        return {**plan, **self.towers.tensor_parallel_plan("towers")}  # The gates are a few outputs wide: whole.

    def dense_logits(self, dense: torch.Tensor, pooled: Pooled) -> torch.Tensor:
        x = self.concatenated(dense, pooled)
        task_inputs, shared = [x] * self.num_tasks, x
        for level in self.levels:
            task_inputs, shared = level(task_inputs, shared)
        logits: torch.Tensor = self.towers(task_inputs)
        return logits


@ZOO_MODELS.register("ple", PLEConfig)
def ple(config: PLEConfig, inputs: ModelInputs) -> nn.Module:
    width = input_width(inputs, config)
    return PLE(inputs.vectors(config.embeddings), inputs.features, inputs.num_dense, width, config, inputs.num_tasks)
