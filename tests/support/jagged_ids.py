"""Jagged ids written by hand, for the embedding tests."""

from __future__ import annotations

import torch

from embedding import JaggedIds


def jagged(ids: list[int], lengths: list[int], weights: list[float] | None = None) -> JaggedIds:
    """Bags of ``lengths[b]`` ids each, one after the other, weighted by ``weights`` where given."""
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    return JaggedIds(torch.tensor(ids), offsets, None if weights is None else torch.tensor(weights))
