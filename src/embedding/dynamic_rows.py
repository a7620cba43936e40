"""The rows of a dynamic (hash) table's shard: ids mapped to slots, new ids' rows initialised.

A lookup hands the ids its rank owns to :meth:`DynamicRows.rows` and gets the rows of the
shard's buffer to read: a slot for an id that has one, else the shard's default row, a row of
zeros after the slots that no gradient reaches (:meth:`DynamicRows.keep_updates` drops them).
In training, absent ids are offered for admission, and a slot given to a new id (a free one or
an evicted id's) gets the id's initial values and fresh optimizer state before anything reads
it: an evicted id leaves nothing behind.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping

import numpy as np
import torch

from embedding.config import EmbeddingTableConfig
from embedding.hash_index import HashIndex
from embedding.id_hashing import init_rows_by_key


class DynamicRows:
    """The slots of one hash table's shard of ``capacity`` rows, on ``rank`` of ``num_ranks``."""

    def __init__(self, config: EmbeddingTableConfig, capacity: int, seed: int, rank: int, num_ranks: int) -> None:
        self.config = config
        self.rank, self.num_ranks = rank, num_ranks
        self.index = HashIndex(capacity, config.hash_policy, seed=seed)
        self.default_row = capacity
        self._salt = zlib.crc32(f"{seed}/{config.name}".encode())
        self._init_scale = config.init_scale if config.init_scale is not None else (1.0 / config.num_rows) ** 0.5
        self.state_fill: dict[str, float] = {}
        """The value each optimizer state starts from, by state name; set by the optimizer."""

    def rows(
        self,
        ids: torch.Tensor,
        weight: torch.Tensor,
        optimizer_state: Mapping[str, torch.Tensor],
        training: bool,
    ) -> torch.Tensor:
        """The buffer rows of ``ids``; in training, admitting and inserting them first."""
        keys = ids.detach().to("cpu", torch.int64).numpy()
        if not training:
            slots = self.index.find(keys)
        else:
            slots, inserted = self.index.touch_or_insert(keys, self.config.name)
            if inserted.size:
                self._reset(inserted, weight, optimizer_state)
        slots[slots < 0] = self.default_row
        return torch.from_numpy(slots).to(ids.device)

    def keep_updates(self, rows: torch.Tensor) -> torch.Tensor | None:
        """Which of ``rows`` may be updated (``None``: all): every one but the default row."""
        mask = rows != self.default_row
        return None if bool(mask.all()) else mask

    def statistics(self) -> dict[str, float]:
        return self.index.statistics()

    def _reset(self, slots: np.ndarray, weight: torch.Tensor, optimizer_state: Mapping[str, torch.Tensor]) -> None:
        keys = self.index.keys[slots]
        if weight.device.type == "cpu":
            init_rows_by_key(weight.numpy(), slots, keys, self._salt, self._init_scale, self._normal)
        else:
            values = torch.empty((slots.size, weight.size(1)), dtype=torch.float32)
            init_rows_by_key(values.numpy(), np.arange(slots.size), keys, self._salt, self._init_scale, self._normal)
            weight[torch.from_numpy(slots).to(weight.device)] = values.to(weight.device)
        rows = torch.from_numpy(slots).to(weight.device)
        for name, tensor in optimizer_state.items():
            tensor[rows] = self.state_fill[name]

    @property
    def _normal(self) -> bool:
        return self.config.initializer == "normal"
