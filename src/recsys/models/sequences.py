"""Jagged sequences as a model reads them: padded to ``[B, max_len, dim]`` with a mask, where a model asks.

A table that does not pool (a ``sequence`` column's) gives a batch's sequences as they come, every id's vector
one after the other, ``[ids, dim]``, with the feature's row offsets: no padding travels through the reader, the
lookup or the tables' update. A model that attends over a sequence pads it once per batch (``SequenceLayout``,
computed from the offsets and shared by every feature of that layout), entirely on the device and without
reading a length back to the host. A model whose costly part is per id (DIN's MLP at every item) runs it on the
jagged ids instead and pads one score an id at most: the layout's ``softmax`` and ``row_sums`` take and give jagged
values, so no time goes to padded positions or to copying every vector into a padded tensor and its gradient back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SequenceLayout:
    """Where each id of a jagged batch goes in the padded one: its row and its position in the row (the oldest
    kept id first), and ``mask[b, p]``: whether row ``b`` has an id at position ``p``."""

    rows: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor
    lengths: torch.Tensor

    @classmethod
    def of(cls, offsets: torch.Tensor, num_ids: int, max_len: int) -> SequenceLayout:
        """The layout of ``num_ids`` ids in rows cut by ``offsets`` (``B + 1`` of them), each row at most
        ``max_len`` long (the reader keeps a sequence's latest ``max_len`` ids)."""
        offsets = offsets.to(torch.int64)
        lengths = offsets[1:] - offsets[:-1]
        batch = lengths.numel()
        rows = torch.repeat_interleave(torch.arange(batch, device=offsets.device), lengths, output_size=num_ids)
        positions = torch.arange(num_ids, device=offsets.device) - offsets[rows]
        mask = torch.zeros(batch, max_len, dtype=torch.bool, device=offsets.device)
        mask[rows, positions] = True
        return cls(rows, positions, mask, lengths)

    def recency(self) -> torch.Tensor:
        """Each id's distance from the end of its row: 0 for a row's latest, the index of a position embedding that
        means the same in every row, whatever its length."""
        return self.lengths[self.rows] - 1 - self.positions

    def pad(self, vectors: torch.Tensor) -> torch.Tensor:
        """The ids' vectors ``[ids, dim]`` as ``[B, max_len, dim]``, zeros where a row has no id (gradients flow
        back to the vectors)."""
        padded = vectors.new_zeros(*self.mask.shape, vectors.shape[-1])
        return padded.index_put((self.rows, self.positions), vectors)

    def softmax(self, scores: torch.Tensor) -> torch.Tensor:
        """The softmax of the ids' ``scores`` ``[ids]`` over each row's ids, ``[ids]`` (padded as scalars only)."""
        padded = scores.new_full(self.mask.shape, float("-inf")).index_put((self.rows, self.positions), scores)
        # A row of no id is all -inf, whose softmax is NaN: no id reads it.
        return torch.softmax(padded, dim=1)[self.rows, self.positions]

    def row_sums(self, values: torch.Tensor) -> torch.Tensor:
        """The sum of each row's ``values`` ``[ids, dim]``: ``[B, dim]``, zeros for a row of no id."""
        return values.new_zeros(self.mask.shape[0], values.shape[-1]).index_add(0, self.rows, values)

    def row_means(self, values: torch.Tensor) -> torch.Tensor:
        """The mean of each row's ``values`` ``[ids, dim]``: ``[B, dim]``, zeros for a row of no id."""
        return self.row_sums(values) / self.lengths.clamp_min(1).unsqueeze(1).to(values.dtype)


def padding_mask(lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    """``[B, max_len]``: true at a row's first ``lengths[b]`` positions, where a padded sequence (oldest first, as
    serving gives it) holds an id."""
    return torch.arange(max_len, device=lengths.device) < lengths.unsqueeze(1)


def padded_recency(lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    """``[B, max_len]``: each position's distance from its row's latest id (``SequenceLayout.recency`` of a padded
    sequence; 0 after a row's last, where a mask zeroes it)."""
    return (lengths.unsqueeze(1) - 1 - torch.arange(max_len, device=lengths.device)).clamp(min=0)


def masked_mean(padded: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean of each row's vectors ``[B, L, dim]`` over its ids (``mask`` ``[B, L]``); zeros for a row of none."""
    weights = mask.to(padded.dtype).unsqueeze(-1)
    return (padded * weights).sum(1) / weights.sum(1).clamp_min(1.0)
