"""The zoo's retrieval models: ``two_tower`` (a query MLP and an item MLP, YouTube's candidate generation, Yi et
al. RecSys 2019) and ``sasrec`` (a causal transformer over the user's latest items, Kang and McAuley, ICDM 2018),
trained with in-batch negatives and validated by ranking every item (``recsys.retrieval``).

Both name the feature of the item a row is about (``item_feature``: the movie rated next); the item tower sees
that id alone. ``two_tower``'s query tower takes every other feature, a sequence pooled by its mean; ``sasrec``'s
reads the sequence that shares the item's table (``same_ids_as``), its items in order, and scores with the table's
rows themselves, as the paper does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, ClassVar

import torch
from torch import nn
from torch.nn.functional import normalize

from components import PositiveInt, Range
from recipes import ConfigError, DenseForServing, ItemVectors, PooledInput, SequenceInput
from recsys.click.batch import CTRBatch
from recsys.click.models import mlp_with_dropout
from recsys.models.embeddings import table_of
from recsys.models.sequences import SequenceLayout, padded_recency, padding_mask
from recsys.models.transformer import block_output_at, causal_block, dropout
from recsys.retrieval.model import RetrievalModel
from recsys.zoo.splits import linear_pairs, split_outputs
from recsys.zoo.zoo_model import ZOO_MODELS, ModelInputs, OneDimTables, ZooModelConfig

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle


@dataclass
class RetrievalModelConfig(ZooModelConfig):
    """What every retrieval model names: the item feature, the softmax's temperature, the K of the metrics."""

    retrieval: ClassVar[bool] = True
    reads_sequences: ClassVar[bool] = True

    item_feature: str = ""
    """The categorical column of the item each row is about (the movie rated): the item tower's one input, the
    target of the row's query, and the corpus (every id of it in the data) that validation ranks."""
    temperature: Annotated[float, Range(gt=0)] = 0.05
    """Divides the dot products before the softmax over the batch's items."""
    top_k: list[PositiveInt] = field(default_factory=lambda: [10, 50])
    """The K of the validation's ``hr@K`` and ``ndcg@K`` (with one held-out item a row, recall@K is ``hr@K``)."""


def item_feature_of(config: RetrievalModelConfig, inputs: ModelInputs) -> str:
    """``config.item_feature``, checked: a single-valued feature of the model's."""
    item = config.item_feature
    if item not in inputs.features or item in inputs.sequence_lengths:
        raise ConfigError(
            f"`model.item_feature` must name a single-valued categorical column ({', '.join(inputs.features)}), but "
            f"is '{item}' instead."
        )
    return item


class TwoTower(RetrievalModel):
    """A query MLP over the user-side features and an item MLP over the item's vector, each ending in a vector of
    norm 1."""

    def __init__(
        self,
        embeddings: nn.Module,
        features: list[str],
        dims: Mapping[str, int],
        num_dense: int,
        item_feature: str,
        sequence_lengths: Mapping[str, int],
        hidden_dims: list[int],
        out_dim: int,
        dropout: float,
        temperature: float,
    ) -> None:
        super().__init__(embeddings, features, item_feature, temperature)
        self.sequence_lengths = dict(sequence_lengths)
        self.num_dense, self.out_dim = num_dense, out_dim
        self.query_features = [name for name in features if name != item_feature]
        width = num_dense + sum(dims[name] for name in self.query_features)
        self.query_mlp = mlp_with_dropout(width, hidden_dims, out_dim, dropout)
        self.item_mlp = mlp_with_dropout(dims[item_feature], hidden_dims, out_dim, dropout)

    def tensor_parallel_plan(self) -> dict[str, ParallelStyle]:
        """Each tower's layers in pairs, its output layer among them: a tower's output is a vector, whole again
        after its pair (a tower of one hidden layer, the default, is one pair)."""
        towers = {"query_mlp": self.query_mlp, "item_mlp": self.item_mlp}
        return {
            name: style
            for prefix, tower in towers.items()
            for name, style in linear_pairs(tower, prefix, "model.hidden_dims", keep_last=False).items()
        }

    def forward(self, batch: CTRBatch) -> tuple[torch.Tensor, torch.Tensor]:
        vectors = self.embeddings(batch.sparse)
        parts = [batch.dense]
        for name in self.query_features:
            if name in self.sequence_lengths:
                rows = vectors[name]
                layout = SequenceLayout.of(batch.sparse[name].offsets, rows.shape[0], self.sequence_lengths[name])
                parts.append(layout.row_means(rows))
            else:
                parts.append(vectors[name])
        queries = normalize(self.query_mlp(torch.cat(parts, dim=1)), dim=-1)
        return queries, normalize(self.item_mlp(vectors[self.item_feature]), dim=-1)

    def items(self, ids: torch.Tensor) -> torch.Tensor:
        return normalize(self.item_mlp(self.item_rows(ids)), dim=-1)

    def dense_for_serving(self) -> DenseForServing:
        """The query tower over pooled inputs (a sequence pooled by its mean, as the tower pools it), and the item
        tower, which ``export`` runs over every row of the item table."""
        inputs = tuple(
            PooledInput(*table_of(self.embeddings, name), "mean" if name in self.sequence_lengths else "sum")
            for name in self.query_features
        )
        table, _, _ = table_of(self.embeddings, self.item_feature)
        items = ItemVectors(table, self.item_feature, _Normalized(self.item_mlp), self.out_dim)
        return DenseForServing(_QueryTower(self), self.num_dense, inputs, items=items, temperature=self.temperature)


class _Normalized(nn.Module):
    """``module``'s output at norm 1."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return normalize(self.module(x), dim=-1)


class _QueryTower(nn.Module):
    """The two-tower model's query tower over the dense features and a list of pooled vectors: what ``torch.export``
    traces."""

    def __init__(self, model: TwoTower) -> None:
        super().__init__()
        self.mlp = _Normalized(model.query_mlp)

    def forward(self, dense: torch.Tensor, pooled: list[torch.Tensor]) -> torch.Tensor:
        queries: torch.Tensor = self.mlp(torch.cat([dense, *pooled], dim=1))
        return queries


@dataclass
class TwoTowerConfig(RetrievalModelConfig):
    hidden_dims: list[PositiveInt] = field(default_factory=lambda: [256])
    """Each tower's hidden layers."""
    out_dim: PositiveInt = 64
    """The width of the query and item vectors."""
    dropout: Annotated[float, Range(ge=0, lt=1)] = 0.1
    """Dropout after each tower's hidden layers."""


@ZOO_MODELS.register("two_tower", TwoTowerConfig)
def two_tower(config: TwoTowerConfig, inputs: ModelInputs) -> nn.Module:
    section = config.embeddings
    dims = inputs.dims_by_feature(section)
    return TwoTower(
        inputs.vectors(section),
        inputs.features,
        dims,
        inputs.num_dense,
        item_feature_of(config, inputs),
        inputs.sequence_lengths,
        config.hidden_dims,
        config.out_dim,
        config.dropout,
        config.temperature,
    )


class SASRec(RetrievalModel):
    """Self-attention over the user's latest items: each item's vector (times ``sqrt(dim)``) plus a learnt vector
    of its recency (0 for the latest: the paper pads sequences at the front, so that a position counts from the
    end), through causal transformer blocks; the query is the output at the sequence's last item, scored
    against the item table's own rows."""

    def __init__(
        self,
        embeddings: nn.Module,
        features: list[str],
        item_feature: str,
        sequence: str,
        max_len: int,
        dim: int,
        num_blocks: int,
        num_heads: int,
        dropout: float,
        temperature: float,
    ) -> None:
        super().__init__(embeddings, features, item_feature, temperature)
        self.sequence = sequence
        self.max_len = max_len
        self.positions = nn.Embedding(max_len, dim)
        self.dropout_p = dropout
        # torch's layers hold the parameters; recsys.models.transformer runs them (the same outputs, faster).
        block = nn.TransformerEncoderLayer(dim, num_heads, dim, dropout, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, num_blocks, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)

    def tensor_parallel_plan(self) -> dict[str, ParallelStyle]:
        from torch.distributed.tensor.parallel import RowwiseParallel

        plan: dict[str, ParallelStyle] = {}
        for index in range(len(self.blocks.layers)):  # Each block's feed-forward pair, ``dim`` wide; attention whole.
            plan[f"blocks.layers.{index}.linear1"] = split_outputs("model.embeddings.dim")
            plan[f"blocks.layers.{index}.linear2"] = RowwiseParallel()
        return plan

    def forward(self, batch: CTRBatch) -> tuple[torch.Tensor, torch.Tensor]:
        vectors = self.embeddings(batch.sparse)
        rows, offsets = vectors[self.sequence], batch.sparse[self.sequence].offsets
        layout = SequenceLayout.of(offsets, rows.shape[0], self.max_len)
        items = layout.pad(rows * rows.shape[-1] ** 0.5 + self.positions(layout.recency()))
        hidden = dropout(items, self.dropout_p, self.training)
        return _query(self.blocks, self.norm, hidden, layout.lengths), vectors[self.item_feature]

    def items(self, ids: torch.Tensor) -> torch.Tensor:
        return self.item_rows(ids)

    def dense_for_serving(self) -> DenseForServing:
        """The query from the sequence's rows as a serving system pads them, and the item table's rows as the item
        vectors (SASRec scores against them as they are)."""
        table, _, dim = table_of(self.embeddings, self.sequence)
        sequence = SequenceInput(table, self.sequence, dim, self.max_len)
        items = ItemVectors(table, self.item_feature, nn.Identity(), dim)
        query = _SASRecQuery(self.positions, self.blocks, self.norm)
        return DenseForServing(query, 0, (), sequences=(sequence,), items=items, temperature=self.temperature)


def _query(blocks: nn.TransformerEncoder, norm: nn.Module, hidden: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Each row's query: the causal blocks over its inputs ``[B, max_len, dim]`` (zeros after the row's last), read
    at its latest item (position 0 for a row of none)."""
    *early, final = blocks.layers
    for block in early:
        hidden = causal_block(block, hidden)
    queries: torch.Tensor = norm(block_output_at(final, hidden, (lengths - 1).clamp(min=0)))
    return queries


class _SASRecQuery(nn.Module):
    """SASRec's query tower over a sequence's rows padded as serving gives them, ``[B, max_len, dim]`` and the
    lengths ``[B]`` (rows after a length are ignored): what ``torch.export`` traces."""

    def __init__(self, positions: nn.Embedding, blocks: nn.TransformerEncoder, norm: nn.Module) -> None:
        super().__init__()
        self.positions, self.blocks, self.norm = positions, blocks, norm

    def forward(
        self,
        dense: torch.Tensor,
        pooled: list[torch.Tensor],
        sequences: list[torch.Tensor],
        lengths: list[torch.Tensor],
    ) -> torch.Tensor:
        rows, length, max_len = sequences[0], lengths[0], sequences[0].shape[1]
        items = rows * rows.shape[-1] ** 0.5 + self.positions(padded_recency(length, max_len))
        return _query(self.blocks, self.norm, items * padding_mask(length, max_len).unsqueeze(-1), length)


@dataclass
class SASRecConfig(OneDimTables, RetrievalModelConfig):
    needs_sequence: ClassVar[bool] = True

    temperature: Annotated[float, Range(gt=0)] = 1.0
    """Divides the dot products of the query and the item rows (not normalised, as the paper's)."""
    num_blocks: PositiveInt = 2
    """Transformer blocks (the paper's 2 on MovieLens-1M)."""
    num_heads: PositiveInt = 1
    """Attention heads a block (the paper's 1); must divide ``embeddings.dim``."""
    dropout: Annotated[float, Range(ge=0, lt=1)] = 0.2
    """Dropout on the inputs and in every block (the paper's 0.2 on MovieLens-1M)."""


@ZOO_MODELS.register("sasrec", SASRecConfig)
def sasrec(config: SASRecConfig, inputs: ModelInputs) -> nn.Module:
    item = item_feature_of(config, inputs)
    table = next(table for table in inputs.tables if item in table.features)
    sequences = [name for name in table.features if name in inputs.sequence_lengths]
    if len(sequences) != 1:
        raise ConfigError(
            f"`sasrec` reads the sequence that shares the table of `model.item_feature` '{item}' (`same_ids_as`), so "
            f"that table must be looked up by one sequence, but is by {len(sequences)}."
        )
    if config.embeddings.dim % config.num_heads:
        raise ConfigError(
            f"`model.num_heads` must divide `model.embeddings.dim` ({config.embeddings.dim}), but is "
            f"{config.num_heads} instead."
        )
    sequence = sequences[0]
    others = [name for name in inputs.features if name not in (item, sequence)] + ["dense"] * (inputs.num_dense > 0)
    if others:
        raise ConfigError(
            f"`sasrec` reads the sequence '{sequence}' and scores the item '{item}' alone, so the schema must have no "
            f"other feature, but has {', '.join(others)} (their tables would never train): use `two_tower` for them."
        )
    return SASRec(
        inputs.vectors(config.embeddings),
        inputs.features,
        item,
        sequence,
        inputs.sequence_lengths[sequence],
        config.embeddings.dim,
        config.num_blocks,
        config.num_heads,
        config.dropout,
        config.temperature,
    )
