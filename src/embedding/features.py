"""Sparse features of a batch: per feature, a jagged list of ids per sample."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class JaggedIds:
    """The ids of one feature for a batch: sample ``i`` has ``ids[offsets[i]:offsets[i + 1]]``.

    ``offsets`` starts at 0 and ends at ``len(ids)``: lookups concatenate features by shifting
    offsets, which a sync-free check cannot verify on an accelerator.

    ``weights``, when given, holds one weight per id (for weighted pooling).
    """

    ids: torch.Tensor
    offsets: torch.Tensor
    weights: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.ids.dim() != 1 or self.offsets.dim() != 1:
            raise ValueError(
                f"`ids` and `offsets` must be 1-D, but have shapes {tuple(self.ids.shape)} and "
                f"{tuple(self.offsets.shape)} instead."
            )
        if self.weights is not None and self.weights.shape != self.ids.shape:
            raise ValueError(
                f"`weights` must have the shape of `ids` {tuple(self.ids.shape)}, but has "
                f"{tuple(self.weights.shape)} instead."
            )

    @property
    def batch_size(self) -> int:
        return self.offsets.numel() - 1

    @classmethod
    def from_dense(cls, ids: torch.Tensor) -> JaggedIds:
        """The same number of ids per sample, from a ``[batch, n]`` tensor."""
        batch, n = ids.shape
        offsets = torch.arange(0, (batch + 1) * n, n, dtype=torch.int64, device=ids.device)
        return cls(ids.reshape(-1).to(torch.int64), offsets)

    def to(self, device: torch.device) -> JaggedIds:
        """The ids on ``device``; ``self`` when they are all there already."""
        tensors = (self.ids, self.offsets) if self.weights is None else (self.ids, self.offsets, self.weights)
        if all(tensor.device == device for tensor in tensors):
            return self
        weights = None if self.weights is None else self.weights.to(device)
        return JaggedIds(self.ids.to(device), self.offsets.to(device), weights)


class PreparedInput(Protocol):
    """A lookup of these very features prepared ahead by one collection of tables (a train pipeline's work),
    which that collection's training forward uses instead of preparing it again."""

    @property
    def owner(self) -> object: ...


class SparseFeatures(Mapping[str, JaggedIds]):
    """The sparse features of a batch, by name, all of the same batch size.

    ``prepared`` holds what collections prepared ahead for these features (``with_prepared``):
    the hand-over from a train pipeline to the tables travels with the features themselves.
    """

    def __init__(self, features: Mapping[str, JaggedIds], prepared: Sequence[PreparedInput] = ()) -> None:
        sizes = {name: f.batch_size for name, f in features.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"Every feature must have the same batch size, but they have {sizes} instead.")
        self._features = dict(features)
        self.prepared = tuple(prepared)

    def with_prepared(self, prepared: PreparedInput) -> SparseFeatures:
        """The same features, carrying ``prepared`` too (in place of what its owner prepared before)."""
        others = [earlier for earlier in self.prepared if earlier.owner is not prepared.owner]
        return SparseFeatures(self._features, [*others, prepared])

    def prepared_for(self, owner: object) -> PreparedInput | None:
        """What ``owner`` prepared ahead for these features, if it did."""
        return next((prepared for prepared in self.prepared if prepared.owner is owner), None)

    @property
    def batch_size(self) -> int:
        return next(iter(self._features.values())).batch_size if self._features else 0

    def __getitem__(self, name: str) -> JaggedIds:
        return self._features[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._features)

    def __len__(self) -> int:
        return len(self._features)

    def to(self, device: torch.device) -> SparseFeatures:
        """The features on ``device``: ``self`` when they are all there already, as the
        collection moves every batch it looks up."""
        moved = {name: f.to(device) for name, f in self._features.items()}
        if all(moved[name] is f for name, f in self._features.items()):
            return self
        return SparseFeatures(moved)
