"""The ``gelu_mlp`` zoo model: the fields' vectors and the dense features, concatenated, through GELU layers.

It shows what a model of the zoo owes the framework: a config dataclass of its own options (``activation_scale``
below cannot be set on another model), a factory over the recipe's tables and features, and the plan by which
its MLP splits over tensor-parallel ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from torch.distributed.tensor.parallel import ParallelStyle

from components import PositiveFloat, PositiveInt
from recipes import megatron_mlp_plan
from recsys.click.batch import CTRBatch
from recsys.zoo import ZOO_MODELS, ModelInputs, ZooModelConfig


@dataclass
class GeluMLPConfig(ZooModelConfig):
    hidden_dims: list[PositiveInt] = field(default_factory=lambda: [32])
    activation_scale: PositiveFloat = 1.0
    """GELU's input is scaled by this: sharper (> 1) or smoother (< 1) than the standard one."""


class GeluMLP(nn.Module):
    def __init__(self, embeddings: nn.Module, features: list[str], dim: int, num_dense: int, config: GeluMLPConfig):
        super().__init__()
        self.embeddings = embeddings
        self.features = features
        self.scale = config.activation_scale
        layers: list[nn.Module] = []
        width = num_dense + dim * len(features)
        for hidden in config.hidden_dims:
            layers.append(nn.Linear(width, hidden))
            width = hidden
        layers.append(nn.Linear(width, 1))
        self.mlp = nn.Sequential(*layers)

    def forward(self, batch: CTRBatch) -> torch.Tensor:
        pooled = self.embeddings(batch.sparse)
        x = torch.cat([batch.dense, *(pooled[name] for name in self.features)], dim=1)
        for layer in list(self.mlp)[:-1]:
            x = nn.functional.gelu(layer(x) * self.scale)
        logits: torch.Tensor = self.mlp[-1](x).squeeze(1)
        return logits

    def tensor_parallel_plan(self) -> dict[str, ParallelStyle]:
        return megatron_mlp_plan(self.mlp, "mlp")


@ZOO_MODELS.register("gelu_mlp", GeluMLPConfig)
def gelu_mlp(config: GeluMLPConfig, inputs: ModelInputs) -> nn.Module:
    section = config.embeddings
    return GeluMLP(inputs.vectors(section), inputs.features, section.dim, inputs.num_dense, config)
