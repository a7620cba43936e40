"""DIN: the candidate item attends over the user's behaviour sequence (Zhou et al., Deep Interest Network for
Click-Through Rate Prediction, KDD 2018).

A pooled history gives a user one vector whatever the candidate; DIN weighs each item of the history by how it
relates to the candidate (an activation unit: an MLP over the two vectors, their difference and their product),
so that a user who watched both comedies and war films is scored for a comedy by the comedies. The weights are
normalised over the sequence by a softmax of the unit's outputs scaled by ``1 / sqrt(dim)``, as the authors'
released code does: the unnormalised sum the paper describes grows with a history's length, and trained worse
here (valid AUC 0.684 against 0.695 on ``movielens_din``, seed 0).

Each sequence feature attends with the candidate that shares its table (declared in the schema by
``same_ids_as``: one row per movie for both); a sequence without one is pooled by its mean. The attended
vectors, every other feature's vector and the dense features go into the deep MLP.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import nn

from components import PositiveInt
from recipes import ConfigError, DenseForServing, PooledInput, SequenceInput
from recsys.click.batch import CTRBatch
from recsys.click.models import ServedSequenceModel, TaskModel, mlp_with_dropout, pooled_input, task_logits
from recsys.models.embeddings import table_of
from recsys.models.sequences import SequenceLayout, padding_mask
from recsys.zoo.splits import linear_pairs
from recsys.zoo.zoo_model import ZOO_MODELS, DeepModelConfig, ModelInputs

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle


class ActivationUnit(nn.Module):
    """The weight of each item of a sequence for a candidate: an MLP over ``[item, candidate, item - candidate,
    item * candidate]`` with the paper's sigmoid hidden layers, one score out, softmax-normalised over the row's
    items.

    The first layer is computed folded, as ``item @ (W_i + W_d) + (item * candidate) @ W_p`` plus the row's
    ``candidate @ (W_c - W_d) + b``, once a row (``W_i, W_c, W_d, W_p``: its weight's four blocks): the same
    function of the same parameters (``mlp`` keeps the paper's layout, and checkpoints with it), with half the
    multiplications at every item and no ``[ids, 4 * dim]`` input written and read back. It runs on the jagged
    items, never on padding. The two took DIN's training step from 1.0-1.1x to 1.5-1.7x plain torch's samples/s
    (``benchmarks/sequence_step.py``, docs/benchmarks.md)."""

    def __init__(self, dim: int, hidden_dims: list[int]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        in_dim = 4 * dim
        for hidden in hidden_dims:
            layers += [nn.Linear(in_dim, hidden), nn.Sigmoid()]
            in_dim = hidden
        layers.append(nn.Linear(in_dim, 1, bias=False))  # A bias would add the same to every score: softmax drops it.
        self.mlp = nn.Sequential(*layers)

    def forward(self, items: torch.Tensor, candidate: torch.Tensor, layout: SequenceLayout) -> torch.Tensor:
        """The weighted sum of each row's ``items`` ``[ids, dim]`` (jagged, rows as ``layout`` says) for the row's
        ``candidate`` ``[B, dim]``: ``[B, dim]``; zeros for a row of no item."""
        bias, w_row, w_item = self._first_layer(items.shape[-1])
        per_row = torch.addmm(bias, candidate, w_row.t())
        row_candidate = candidate.index_select(0, layout.rows)
        per_item = torch.cat([items, items * row_candidate], dim=1)
        hidden = torch.addmm(per_row.index_select(0, layout.rows), per_item, w_item.t())
        return layout.row_sums(items * layout.softmax(self._scores(hidden, items.shape[-1])).unsqueeze(-1))

    def padded(self, items: torch.Tensor, candidate: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``forward`` over padded items ``[B, L, dim]`` with their ``mask`` ``[B, L]``, as serving gives them."""
        bias, w_row, w_item = self._first_layer(items.shape[-1])
        per_row = torch.addmm(bias, candidate, w_row.t()).unsqueeze(1)
        per_item = torch.cat([items, items * candidate.unsqueeze(1)], dim=-1)
        scores = self._scores(per_row + per_item @ w_item.t(), items.shape[-1]).masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=1).nan_to_num(0.0)  # A row of no item: all -inf, no weight.
        return (items * weights.unsqueeze(-1)).sum(dim=1)

    def _first_layer(self, dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The first layer folded: its bias, the weight of the candidate's once-a-row part, and the weight of
        ``[item, item * candidate]``."""
        first = self.mlp[0]
        assert isinstance(first, nn.Linear)
        w_item, w_candidate, w_difference, w_product = first.weight.split(dim, dim=1)
        return first.bias, w_candidate - w_difference, torch.cat([w_item + w_difference, w_product], dim=1)

    def _scores(self, hidden: torch.Tensor, dim: int) -> torch.Tensor:
        """The rest of the MLP over the first layer's outputs, scaled: one score an item."""
        scores: torch.Tensor = self.mlp[1:](hidden).squeeze(-1) / dim**0.5
        return scores


class DIN(TaskModel):
    """Target attention of each candidate over its sequence, then a deep MLP over every vector and the dense
    features: one click logit a sample (one a task with several)."""

    def __init__(
        self,
        embeddings: nn.Module,
        features: list[str],
        dims: Mapping[str, int],
        num_dense: int,
        sequence_lengths: Mapping[str, int],
        candidates: Mapping[str, str | None],
        attention_dims: list[int],
        hidden_dims: list[int],
        dropout: float,
        num_tasks: int = 1,
    ) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.num_dense = num_dense
        self.sequence_lengths = dict(sequence_lengths)
        self.candidates = dict(candidates)
        self.vectors = [name for name in features if name not in sequence_lengths]
        self.attention = nn.ModuleDict(
            {
                name: ActivationUnit(dims[name], attention_dims)
                for name, candidate in candidates.items()
                if candidate is not None
            }
        )
        width = num_dense + sum(dims[name] for name in features)
        self.mlp = mlp_with_dropout(width, hidden_dims, num_tasks, dropout)

    def tensor_parallel_plan(self) -> dict[str, ParallelStyle]:
        # The activation units are narrow, and run per item.
        return linear_pairs(self.mlp, "mlp", "model.hidden_dims", keep_last=True)

    def forward(self, batch: CTRBatch) -> torch.Tensor:
        looked_up = self.embeddings(batch.sparse)
        interests = []
        for name, max_len in self.sequence_lengths.items():
            items = looked_up[name]
            layout = SequenceLayout.of(batch.sparse[name].offsets, items.shape[0], max_len)
            candidate = self.candidates[name]
            if candidate is None:
                interests.append(layout.row_means(items))
            else:
                interests.append(self.attention[name](items, looked_up[candidate], layout))
        return self.logits(batch.dense, [looked_up[name] for name in self.vectors], interests)

    def logits(self, dense: torch.Tensor, vectors: list[torch.Tensor], interests: list[torch.Tensor]) -> torch.Tensor:
        """The deep MLP over the dense features, the vectors of ``self.vectors`` and each sequence's interest."""
        return task_logits(self.mlp(torch.cat([dense, *vectors, *interests], dim=1)))

    def dense_for_serving(self) -> DenseForServing:
        """The deep MLP and the activation units over the looked-up vectors (a sequence without a candidate pooled
        by its mean, as the model pools it) and each attended sequence's rows, padded."""
        inputs = [pooled_input(self.embeddings, name) for name in self.vectors]
        inputs += [PooledInput(*table_of(self.embeddings, name), "mean") for name in self._attended(False)]
        sequences = tuple(
            SequenceInput(*table_of(self.embeddings, name), self.sequence_lengths[name])
            for name in self._attended(True)
        )
        return DenseForServing(
            ServedSequenceModel(self), self.num_dense, tuple(inputs), self.served_outputs(), sequences=sequences
        )

    def served_logits(
        self,
        dense: torch.Tensor,
        pooled: list[torch.Tensor],
        sequences: list[torch.Tensor],
        lengths: list[torch.Tensor],
    ) -> torch.Tensor:
        """The logits from the inputs ``dense_for_serving`` lists: the vectors, the padded sequences' rows."""
        vectors = dict(zip(self.vectors, pooled, strict=False))
        means = dict(zip(self._attended(False), pooled[len(self.vectors) :], strict=True))
        padded = dict(zip(self._attended(True), zip(sequences, lengths, strict=True), strict=True))
        interests = []
        for name, max_len in self.sequence_lengths.items():
            candidate = self.candidates[name]
            if candidate is None:
                interests.append(means[name])
            else:
                (rows, length), unit = padded[name], self.attention[name]
                assert isinstance(unit, ActivationUnit)
                interests.append(unit.padded(rows, vectors[candidate], padding_mask(length, max_len)))
        return self.logits(dense, [vectors[name] for name in self.vectors], interests)

    def _attended(self, attended: bool) -> list[str]:
        """The sequences that attend (those with a candidate), or the others."""
        return [name for name in self.sequence_lengths if (self.candidates[name] is not None) == attended]


@dataclass
class DINConfig(DeepModelConfig):
    """DIN's options; the deep MLP's defaults are the paper's (200, 80)."""

    reads_sequences: ClassVar[bool] = True
    needs_sequence: ClassVar[bool] = True

    hidden_dims: list[PositiveInt] = field(default_factory=lambda: [200, 80])
    attention_dims: list[PositiveInt] = field(default_factory=lambda: [80, 40])
    """The activation unit's hidden layers (the paper's 80, 40), which weigh each item of a sequence for the
    candidate."""


def candidates_of(inputs: ModelInputs) -> dict[str, str | None]:
    """Each sequence's candidate: the one feature of its table that is not a sequence (``None``: there is none)."""
    candidates: dict[str, str | None] = {}
    for name in inputs.sequence_lengths:
        table = next(table for table in inputs.tables if name in table.features)
        others = [feature for feature in table.features if feature not in inputs.sequence_lengths]
        if len(others) > 1:
            raise ConfigError(
                f"The sequence '{name}' must share its table with one candidate at most, but its table "
                f"'{table.name}' is looked up by {', '.join(others)}."
            )
        candidates[name] = others[0] if others else None
    return candidates


@ZOO_MODELS.register("din", DINConfig)
def din(config: DINConfig, inputs: ModelInputs) -> nn.Module:
    section = config.embeddings
    dims = inputs.dims_by_feature(section)
    return DIN(
        inputs.vectors(section),
        inputs.features,
        dims,
        inputs.num_dense,
        inputs.sequence_lengths,
        candidates_of(inputs),
        config.attention_dims,
        config.hidden_dims,
        config.dropout,
        inputs.num_tasks,
    )
