"""The rows of a dynamic (hash) table's shard: ids mapped to slots, new ids' rows initialised.

A lookup hands the ids its rank owns to :meth:`DynamicRows.rows` and gets the rows of the
shard's buffer to read: a slot for an id that has one, else the shard's default row, a row of
zeros after the slots that no gradient reaches (:meth:`DynamicRows.keep_updates` drops them).
In training, absent ids are offered for admission, and a slot given to a new id (a free one or
an evicted id's) gets the id's initial values and fresh optimizer state before anything reads
it: an evicted id leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from embedding.hash_index import HashIndex, HashPolicy
from embedding.id_hashing import init_rows_by_key, init_salt
from embedding.table_config import EmbeddingConfigError, EmbeddingTableConfig

_CPU = torch.device("cpu")


class DynamicRows:
    """The slots of one hash table's shard of ``capacity`` rows, on ``rank`` of ``num_ranks``."""

    def __init__(
        self,
        config: EmbeddingTableConfig,
        capacity: int,
        seed: int,
        rank: int,
        num_ranks: int,
        device: torch.device = _CPU,
    ) -> None:
        self.config = config
        self.rank, self.num_ranks = rank, num_ranks
        self.index = _index_on(device, capacity, config.hash_policy, seed)
        reachable = self.index.sketch.shape[1]
        if config.hash_policy.min_count > max(reachable, 1):
            raise EmbeddingConfigError(
                f"`min_count` of hash table '{config.name}' must be at most {reachable}, the count its count-min "
                f"sketch of {reachable} columns on rank {rank} reaches before its counts halve, but is "
                f"{config.hash_policy.min_count} instead: no id would ever be admitted."
            )
        self.default_row = capacity
        self._salt = init_salt(seed, config.name)
        self.state_fill: dict[str, float] = {}
        """The value each optimizer state starts from, by state name; set by the optimizer."""
        self.changed: torch.Tensor | None = None
        """A bool per slot that marks the slots given to a new id: the collection's change tracking
        (:mod:`embedding.row_changes`)."""

    def rows(
        self,
        ids: torch.Tensor,
        weight: torch.Tensor,
        optimizer_state: Mapping[str, torch.Tensor],
        training: bool,
    ) -> torch.Tensor:
        """The buffer rows of ``ids``; in training, admitting and inserting them first."""
        slots, inserted = self.look_up(ids, training)
        if inserted.numel():
            self.reset(inserted, inserted, weight, optimizer_state)
            if self.changed is not None:
                self.changed[inserted.to(self.changed.device)] = True
        return torch.where(slots < 0, self.default_row, slots)

    def look_up(self, ids: torch.Tensor, training: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The slot of each of ``ids`` (-1: none), and the slots given to new ids, which :meth:`reset` must start
        before anything reads them (a table stored off the device brings the slots into its cache first)."""
        return self.index.look_up(ids, training, self.config.name)

    def keep_updates(self, rows: torch.Tensor) -> torch.Tensor | None:
        """Which of ``rows`` may be updated (``None``: all): every one but the default row."""
        mask = rows != self.default_row
        return None if bool(mask.all()) else mask

    def statistics(self) -> dict[str, float]:
        return self.index.statistics()

    def reset(
        self,
        slots: torch.Tensor,
        rows: torch.Tensor,
        weight: torch.Tensor,
        optimizer_state: Mapping[str, torch.Tensor],
    ) -> None:
        """Rows ``rows`` of ``weight`` and the state get the initial values of the ids now in ``slots``."""
        keys = self.index.keys_of(slots)
        rows = rows.to(weight.device)
        if weight.device.type == "cpu" and weight.dtype == torch.float32:
            init_rows_by_key(weight.numpy(), rows.numpy(), keys, self._salt, self.config.initial_scale, self._normal)
        else:
            values = torch.empty((keys.size, weight.size(1)), dtype=torch.float32)
            init_rows_by_key(
                values.numpy(), np.arange(keys.size), keys, self._salt, self.config.initial_scale, self._normal
            )
            weight[rows] = values.to(weight.device, weight.dtype)  # half-precision rows: rounded to nearest
        for name, tensor in optimizer_state.items():
            tensor[rows] = self.state_fill[name]

    @property
    def _normal(self) -> bool:
        return self.config.initializer == "normal"


def _index_on(device: torch.device, capacity: int, policy: HashPolicy, seed: int) -> HashIndex:
    """The index next to the rows: on a GPU, lookups stay on the device (numba.cuda, imported only there)."""
    if device.type != "cuda":
        return HashIndex(capacity, policy, seed=seed)
    from embedding.cuda_hash_index import CudaHashIndex

    return CudaHashIndex(capacity, policy, seed=seed, device=device)
