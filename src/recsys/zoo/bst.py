"""BST: a transformer over the user's behaviour sequence with the candidate item appended (Chen et al., Behavior
Sequence Transformer for E-commerce Recommendation in Alibaba, DLP-KDD 2019).

Where DIN weighs each item of the sequence for the candidate, BST lets every item, and the candidate, attend to
every other, each with a learnt vector of its recency (0 for the latest item; the paper's position is the time
since the behaviour; the candidate has one of its own): the order of the behaviours counts. The
candidate's output and the mean of the sequence's outputs, every other feature's vector and the dense features go
into the deep MLP. The candidate is the feature that shares the sequence's table (``same_ids_as``), as for DIN.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import nn

from components import PositiveInt
from recipes import ConfigError, DenseForServing, SequenceInput
from recsys.click.batch import CTRBatch
from recsys.click.models import ServedSequenceModel, TaskModel, mlp_with_dropout, pooled_input, task_logits
from recsys.models.embeddings import table_of
from recsys.models.sequences import SequenceLayout, masked_mean, padded_recency, padding_mask
from recsys.zoo.din import candidates_of
from recsys.zoo.splits import linear_pairs
from recsys.zoo.zoo_model import ZOO_MODELS, DeepModelConfig, ModelInputs

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle


class BST(TaskModel):
    """A transformer over ``[sequence, candidate]`` for the one sequence, then the deep MLP: a click logit a
    sample (one a task with several)."""

    def __init__(
        self,
        embeddings: nn.Module,
        features: list[str],
        dims: Mapping[str, int],
        num_dense: int,
        sequence: str,
        candidate: str,
        max_len: int,
        num_blocks: int,
        num_heads: int,
        hidden_dims: list[int],
        dropout: float,
        num_tasks: int = 1,
    ) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.sequence, self.candidate, self.max_len = sequence, candidate, max_len
        self.num_dense = num_dense
        self.vectors = [name for name in features if name != sequence]
        dim = dims[sequence]
        self.positions = nn.Embedding(max_len + 1, dim)
        block = nn.TransformerEncoderLayer(dim, num_heads, 4 * dim, dropout, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, num_blocks, enable_nested_tensor=False)
        width = num_dense + sum(dims[name] for name in self.vectors) + 2 * dim
        self.mlp = mlp_with_dropout(width, hidden_dims, num_tasks, dropout)

    def tensor_parallel_plan(self) -> dict[str, ParallelStyle]:
        # The blocks are as narrow as the tables' dim, and stay whole.
        return linear_pairs(self.mlp, "mlp", "model.hidden_dims", keep_last=True)

    def forward(self, batch: CTRBatch) -> torch.Tensor:
        looked_up = self.embeddings(batch.sparse)
        rows = looked_up[self.sequence]
        layout = SequenceLayout.of(batch.sparse[self.sequence].offsets, rows.shape[0], self.max_len)
        items = layout.pad(rows + self.positions(layout.recency()))
        return self.logits(batch.dense, [looked_up[name] for name in self.vectors], items, layout.mask)

    def logits(
        self, dense: torch.Tensor, vectors: list[torch.Tensor], items: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """The deep MLP over the dense features, the vectors of ``self.vectors`` (the candidate's among them) and
        the blocks' outputs over the sequence's inputs ``items`` ``[B, max_len, dim]`` (``mask``: where a row has
        an item) and the candidate."""
        candidate = vectors[self.vectors.index(self.candidate)] + self.positions.weight[-1]
        tokens = torch.cat([items, candidate.unsqueeze(1)], dim=1)
        keep = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        # torch's attention cannot reshape a batch of no row (a rank's empty last batch): there is nothing to attend.
        hidden = self.blocks(tokens, src_key_padding_mask=~keep) if tokens.shape[0] else tokens
        interest = [hidden[:, -1], masked_mean(hidden[:, :-1], mask)]
        return task_logits(self.mlp(torch.cat([dense, *vectors, *interest], dim=1)))

    def served_logits(
        self,
        dense: torch.Tensor,
        pooled: list[torch.Tensor],
        sequences: list[torch.Tensor],
        lengths: list[torch.Tensor],
    ) -> torch.Tensor:
        """The logits from the inputs ``dense_for_serving`` lists: the vectors, the sequence's rows padded."""
        rows, length = sequences[0], lengths[0]
        mask = padding_mask(length, rows.shape[1])
        items = (rows + self.positions(padded_recency(length, rows.shape[1]))) * mask.unsqueeze(-1)
        return self.logits(dense, pooled, items, mask)

    def dense_for_serving(self) -> DenseForServing:
        """The blocks and the deep MLP over the looked-up vectors (the candidate's its row) and the sequence's rows,
        padded."""
        inputs = tuple(pooled_input(self.embeddings, name) for name in self.vectors)
        sequence = SequenceInput(*table_of(self.embeddings, self.sequence), self.max_len)
        return DenseForServing(
            ServedSequenceModel(self), self.num_dense, inputs, self.served_outputs(), sequences=(sequence,)
        )


@dataclass
class BSTConfig(DeepModelConfig):
    """BST's options; one transformer block with 8 heads, as the paper found best."""

    reads_sequences: ClassVar[bool] = True
    needs_sequence: ClassVar[bool] = True

    hidden_dims: list[PositiveInt] = field(default_factory=lambda: [1024, 512, 256])
    num_blocks: PositiveInt = 1
    """Transformer blocks over the sequence and the candidate (the paper's best: 1)."""
    num_heads: PositiveInt = 8
    """Attention heads a block (the paper's 8); must divide the sequence's table dim."""


@ZOO_MODELS.register("bst", BSTConfig)
def bst(config: BSTConfig, inputs: ModelInputs) -> nn.Module:
    section = config.embeddings
    dims = inputs.dims_by_feature(section)
    candidates = {name: candidate for name, candidate in candidates_of(inputs).items() if candidate is not None}
    if len(inputs.sequence_lengths) != 1 or len(candidates) != 1:
        raise ConfigError(
            "`bst` reads one sequence with its candidate (a feature that shares its table, by `same_ids_as`), but the "
            f"schema has {len(inputs.sequence_lengths)} sequence(s), {len(candidates)} with a candidate."
        )
    ((sequence, candidate),) = candidates.items()
    if dims[sequence] % config.num_heads:
        raise ConfigError(
            f"`model.num_heads` must divide the dim of the sequence's table ({dims[sequence]}), but is "
            f"{config.num_heads} instead."
        )
    return BST(
        inputs.vectors(section),
        inputs.features,
        dims,
        inputs.num_dense,
        sequence,
        candidate,
        inputs.sequence_lengths[sequence],
        config.num_blocks,
        config.num_heads,
        config.hidden_dims,
        config.dropout,
        inputs.num_tasks,
    )
