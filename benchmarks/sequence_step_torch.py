"""The batch shape of ``benchmarks/sequence_step.py`` and its two models written in plain torch, as their users
write them: ``nn.Embedding`` tables and the sequence padded to ``[B, MAX_LEN]`` ids with a mask, made when the
batch is made (as a padded data set gives them). Item row 0 is the padding (``padding_idx``: the padded positions
add no row to the sparse gradient); every other id is looked up at ``id + 1``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.functional import cross_entropy

BATCH, MAX_LEN, DIM = 2048, 50, 32
NUM_ITEMS, NUM_USERS = 1_000_000, 1_000_000
SMALL = {"category": 1000, "hour": 24, "device": 8}
NUM_DENSE = 2
ATTENTION_DIMS, HIDDEN_DIMS, DROPOUT = [80, 40], [200, 80], 0.2
"""The zoo's ``din`` defaults (the paper's), which the torch DIN copies."""
NUM_BLOCKS, NUM_HEADS, SASREC_DROPOUT, TEMPERATURE = 2, 1, 0.2, 1.0
"""The zoo's ``sasrec`` defaults (the paper's on MovieLens-1M), which the torch SASRec copies."""


@dataclass(frozen=True)
class PaddedBatch:
    """A batch as a padded data set gives it: the single-valued features' ids, the histories ``[B, MAX_LEN]`` (each
    id + 1 from the first position on, 0 after a row's last) with their mask and lengths."""

    single: dict[str, torch.Tensor]
    history: torch.Tensor
    mask: torch.Tensor
    lengths: torch.Tensor
    dense: torch.Tensor
    labels: torch.Tensor


def mlp(in_dim: int, hidden_dims: list[int], activation: Callable[[], nn.Module], dropout: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    for hidden in hidden_dims:
        layers += [nn.Linear(in_dim, hidden), activation()] + ([nn.Dropout(dropout)] if dropout else [])
        in_dim = hidden
    return nn.Sequential(*layers, nn.Linear(in_dim, 1))


def item_table(sparse: bool) -> nn.Embedding:
    """The item table, row 0 the padding's (zero, and never in a gradient)."""
    table = nn.Embedding(NUM_ITEMS + 1, DIM, sparse=sparse, padding_idx=0)
    nn.init.uniform_(table.weight, -0.05, 0.05)
    with torch.no_grad():
        table.weight[0] = 0.0
    return table


class TorchDIN(nn.Module):
    """DIN: the activation unit (an MLP over ``[item, candidate, item - candidate, item * candidate]`` at every
    position, the scaled softmax over the mask) and the deep MLP with dropout, as the zoo's ``din``."""

    def __init__(self, sparse: bool) -> None:
        super().__init__()
        tables = {name: nn.Embedding(rows, DIM, sparse=sparse) for name, rows in {"user": NUM_USERS, **SMALL}.items()}
        for table in tables.values():
            nn.init.uniform_(table.weight, -0.05, 0.05)
        self.tables = nn.ModuleDict({**tables, "item": item_table(sparse)})
        self.attention = mlp(4 * DIM, ATTENTION_DIMS, nn.Sigmoid, 0.0)
        self.mlp = mlp(NUM_DENSE + DIM * (len(self.tables) + 1), HIDDEN_DIMS, nn.ReLU, DROPOUT)

    def forward(self, batch: PaddedBatch) -> torch.Tensor:
        vectors = {name: self.tables[name](ids) for name, ids in batch.single.items() if name != "item"}
        candidate = self.tables["item"](batch.single["item"] + 1)
        items = self.tables["item"](batch.history)
        expanded = candidate.unsqueeze(1).expand_as(items)
        units = torch.cat([items, expanded, items - expanded, items * expanded], dim=-1)
        scores = (self.attention(units).squeeze(-1) / DIM**0.5).masked_fill(~batch.mask, float("-inf"))
        weights = torch.softmax(scores, dim=1).nan_to_num(0.0)
        interest = torch.einsum("bl,bld->bd", weights, items)
        parts = [batch.dense, vectors["user"], candidate, interest, *(vectors[name] for name in SMALL)]
        return self.mlp(torch.cat(parts, dim=1)).squeeze(1)

    def loss(self, batch: PaddedBatch) -> torch.Tensor:
        return nn.functional.binary_cross_entropy_with_logits(self(batch), batch.labels)


class TorchSASRec(nn.Module):
    """SASRec as the zoo's ``sasrec``: each item's row times ``sqrt(DIM)`` plus a learnt vector of its recency (0
    for a row's latest), zero at the padding, through causal pre-norm transformer blocks; the query is the output at
    a row's latest item, scored against the candidate items' rows of the batch (in-batch softmax)."""

    def __init__(self, sparse: bool, log_shares: torch.Tensor) -> None:
        """``log_shares``: ``log q`` of each item id (its share of the training rows), which corrects the in-batch
        softmax for popular items' turning up more often as negatives."""
        super().__init__()
        self.items = item_table(sparse)
        self.positions = nn.Embedding(MAX_LEN, DIM)
        self.dropout = nn.Dropout(SASREC_DROPOUT)
        block = nn.TransformerEncoderLayer(DIM, NUM_HEADS, DIM, SASREC_DROPOUT, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, NUM_BLOCKS, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(DIM)
        self.register_buffer("causal_mask", torch.triu(torch.ones(MAX_LEN, MAX_LEN, dtype=torch.bool), diagonal=1))
        self.register_buffer("log_shares", log_shares)

    def forward(self, batch: PaddedBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's query and its candidate item's row."""
        steps = torch.arange(MAX_LEN, device=batch.lengths.device)
        recency = (batch.lengths.unsqueeze(1) - 1 - steps).clamp(min=0)
        items = (self.items(batch.history) * DIM**0.5 + self.positions(recency)) * batch.mask.unsqueeze(-1)
        hidden = self.blocks(self.dropout(items), mask=self.causal_mask, is_causal=True)
        last = (batch.lengths - 1).clamp(min=0)
        queries = self.norm(hidden[torch.arange(len(last), device=last.device), last])
        return queries, self.items(batch.single["item"] + 1)

    def loss(self, batch: PaddedBatch) -> torch.Tensor:
        """The in-batch softmax with ``log q`` correction; another row's copy of a row's item is no negative."""
        queries, candidates = self(batch)
        ids = batch.single["item"]
        logits = queries @ candidates.T / TEMPERATURE - self.log_shares[ids].unsqueeze(0)
        same_item = ids.unsqueeze(0) == ids.unsqueeze(1)
        same_item.fill_diagonal_(False)
        logits = logits.masked_fill(same_item, float("-inf"))
        return cross_entropy(logits, torch.arange(len(ids), device=logits.device))
