"""MMoE, and what the zoo's multi-task models share: experts, softmax gates and a tower per task.

A shared-bottom model (``mlp`` with several tasks) makes every task read the same hidden layers; where the tasks
pull those layers in different directions (a feature that raises one task's label and lowers the other's), each
task pays for the other: negative transfer. MMoE (Ma et al., Modeling Task Relationships in Multi-task Learning
with Multi-gate Mixture-of-Experts, KDD 2018) gives the tasks several expert MLPs over the same input and one
softmax gate per task, which mixes the experts for that task from the input; a tower per task reads its mixture.
Tasks that agree share experts, tasks that conflict learn to read different ones.

The input is every feature's pooled vector, concatenated with the dense features, as ``mlp`` reads it. PLE
(``recsys.zoo.ple``) and ESMM (``recsys.zoo.esmm``) are built of the same parts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, ClassVar, cast

import torch
from torch import nn

from components import PositiveInt, Range
from recsys.click.models import VECTORS, Pooled, PooledModel, mlp_with_dropout
from recsys.zoo.splits import linear_pairs
from recsys.zoo.zoo_model import ZOO_MODELS, ModelInputs, ZooModelConfig

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle


@dataclass
class MultiTaskConfig(ZooModelConfig):
    """The options every model of task towers shares: the towers' layers and the dropout of every MLP."""

    multi_task: ClassVar[bool] = True
    min_tasks: ClassVar[int] = 2

    tower_dims: list[PositiveInt] = field(default_factory=lambda: [64])
    """The hidden layers of each task's tower, which maps what the task reads (its experts' mixture, or the input)
    to its one output."""
    dropout: Annotated[float, Range(ge=0, lt=1)] = 0.2
    """Dropout after every hidden layer of the experts and towers, in [0, 1), as in the zoo's deep MLPs."""


@dataclass
class ExpertsConfig(MultiTaskConfig):
    """The options of the models of experts and gates (``mmoe``, ``ple``)."""

    expert_dims: list[PositiveInt] = field(default_factory=lambda: [256, 128])
    """The hidden layers of each expert MLP; the last is the width of what the gates mix."""
    gate_dims: list[PositiveInt] = field(default_factory=list)
    """The hidden layers of each gate before its softmax over the experts; empty: a linear gate, the papers'."""


@dataclass
class MMoEConfig(ExpertsConfig):
    """MMoE's options; the defaults: 4 experts of (256, 128), linear gates, towers of (64)."""

    num_experts: PositiveInt = 4
    """The experts every task's gate mixes (the paper's synthetic study uses 8, its census one 4 to 8)."""


class Expert(nn.Sequential):
    """An MLP whose every layer is hidden (ReLU, then dropout): its output is a representation, which gates mix."""

    def __init__(self, in_dim: int, dims: list[int], dropout: float) -> None:
        layers: list[nn.Module] = []
        for width in dims:
            layers += [nn.Linear(in_dim, width), nn.ReLU(), nn.Dropout(dropout)]
            in_dim = width
        super().__init__(*layers)


def expert_plan(expert: nn.Module, prefix: str) -> dict[str, ParallelStyle]:
    """How an expert splits over the TP gang: consecutive pairs of its linear layers column-wise then row-wise,
    one all-reduce a pair. Every layer of an expert is hidden, so its last pairs too (a last layer of an odd count
    stays whole)."""
    return linear_pairs(expert, prefix, "model.expert_dims", keep_last=False)


class Gate(nn.Module):
    """Softmax weights over ``num_experts`` from an input: a linear layer (or an MLP of ``hidden_dims``)."""

    def __init__(self, in_dim: int, hidden_dims: list[int], num_experts: int) -> None:
        super().__init__()
        self.mlp = mlp_with_dropout(in_dim, hidden_dims, num_experts)

    def forward(self, x: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """The mixture ``[B, width]`` of ``experts`` ``[B, E, width]`` that the gate weighs for ``x``."""
        weights = torch.softmax(self.mlp(x), dim=1)
        return torch.einsum("be,bew->bw", weights, experts)


class Towers(nn.Module):
    """A tower per task, each an MLP of one output: ``[B, T]`` from each task's own input."""

    def __init__(self, in_dim: int, hidden_dims: list[int], num_tasks: int, dropout: float) -> None:
        super().__init__()
        self.towers = nn.ModuleList(mlp_with_dropout(in_dim, hidden_dims, 1, dropout) for _ in range(num_tasks))

    def tensor_parallel_plan(self, prefix: str) -> dict[str, ParallelStyle]:
        plans = (
            linear_pairs(tower, f"{prefix}.towers.{t}", "model.tower_dims", keep_last=True)
            for t, tower in enumerate(self.towers)
        )
        return {name: style for plan in plans for name, style in plan.items()}

    def forward(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([cast(torch.Tensor, tower(x)) for tower, x in zip(self.towers, inputs, strict=True)], dim=1)


class ConcatenatedModel(PooledModel):
    """A model over one vector a sample: the dense features and every feature's pooled vector, concatenated."""

    def __init__(self, embeddings: nn.Module, features: list[str], num_dense: int) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.features = features
        self.num_dense = num_dense

    def lookups(self) -> dict[str, tuple[nn.Module, list[str]]]:
        return {VECTORS: (self.embeddings, self.features)}

    def concatenated(self, dense: torch.Tensor, pooled: Pooled) -> torch.Tensor:
        return torch.cat([dense, *(pooled[VECTORS][name] for name in self.features)], dim=1)


def input_width(inputs: ModelInputs, config: ZooModelConfig) -> int:
    """The width of the concatenated input: the dense features and every feature's vector."""
    return inputs.num_dense + sum(inputs.feature_dims(config.embeddings))


class MMoE(ConcatenatedModel):
    """Experts over the input, a softmax gate per task mixing them, a tower per task over its mixture."""

    def __init__(
        self, embeddings: nn.Module, features: list[str], num_dense: int, width: int, config: MMoEConfig, num_tasks: int
    ) -> None:
        super().__init__(embeddings, features, num_dense)
        self.experts = nn.ModuleList(
            Expert(width, config.expert_dims, config.dropout) for _ in range(config.num_experts)
        )
        self.gates = nn.ModuleList(Gate(width, config.gate_dims, config.num_experts) for _ in range(num_tasks))
        self.towers = Towers(config.expert_dims[-1], config.tower_dims, num_tasks, config.dropout)

    def tensor_parallel_plan(self) -> dict[str, ParallelStyle]:
        plan = {n: s for e, expert in enumerate(self.experts) for n, s in expert_plan(expert, f"experts.{e}").items()}
        return {**plan, **self.towers.tensor_parallel_plan("towers")}  # The gates are E outputs wide: whole.

    def dense_logits(self, dense: torch.Tensor, pooled: Pooled) -> torch.Tensor:
        x = self.concatenated(dense, pooled)
        experts = torch.stack([expert(x) for expert in self.experts], dim=1)
        logits: torch.Tensor = self.towers([gate(x, experts) for gate in self.gates])
        return logits


@ZOO_MODELS.register("mmoe", MMoEConfig)
def mmoe(config: MMoEConfig, inputs: ModelInputs) -> nn.Module:
    width = input_width(inputs, config)
    return MMoE(inputs.vectors(config.embeddings), inputs.features, inputs.num_dense, width, config, inputs.num_tasks)
