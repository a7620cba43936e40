"""Behaviour sequences for the sequence models' tests: rows whose label only the candidate's relation to the items
of the user's sequence predicts (``MembershipData``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import fsspec
import torch

from embedding import JaggedIds, SparseFeatures
from recipes import DenseForServing
from recipes.cli.export import _write_program
from recsys.click.batch import CTRBatch
from recsys.models.embeddings import TableSpec

NUM_ITEMS, NUM_USERS, MIN_LEN, MAX_LEN, NUM_DENSE = 100, 50, 6, 12, 1
TABLES = [TableSpec("user", NUM_USERS, ("user",)), TableSpec("item", NUM_ITEMS, ("item", "history"), "none")]
FEATURES = ["user", "item", "history"]
SEQUENCE_LENGTHS = {"history": MAX_LEN}


@dataclass(frozen=True)
class MembershipData:
    """Each row: a user, a history of ``MIN_LEN`` to ``MAX_LEN`` distinct items, and a candidate item that is one of
    them (label 1) or not (label 0), each half the time. Every item and user is as often positive as negative, so no
    weight per id predicts the label, and a mean of the history's vectors holds the candidate's vector at a
    weight of 1 / length at most: the label is the candidate's match with one item of the sequence."""

    user: torch.Tensor
    item: torch.Tensor
    history: torch.Tensor
    offsets: torch.Tensor
    dense: torch.Tensor
    labels: torch.Tensor

    @classmethod
    def make(cls, num_rows: int, seed: int) -> MembershipData:
        generator = torch.Generator().manual_seed(seed)
        lengths = torch.randint(MIN_LEN, MAX_LEN + 1, (num_rows,), generator=generator)
        histories, candidates = [], []
        labels = torch.randint(0, 2, (num_rows,), generator=generator)
        for row in range(num_rows):
            drawn = torch.randperm(NUM_ITEMS - 1, generator=generator)[: int(lengths[row]) + 1] + 1
            histories.append(drawn[:-1])
            inside = drawn[torch.randint(0, int(lengths[row]), (1,), generator=generator)]
            candidates.append(inside if labels[row] == 1 else drawn[-1:])
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        user = torch.randint(0, NUM_USERS, (num_rows,), generator=generator)
        dense = torch.randn(num_rows, NUM_DENSE, generator=generator)
        return cls(user, torch.cat(candidates), torch.cat(histories), offsets, dense, labels.float())

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, rows: torch.Tensor) -> CTRBatch:
        starts, lengths = self.offsets[rows], torch.diff(self.offsets)[rows]
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        positions = torch.repeat_interleave(starts - offsets[:-1], lengths) + torch.arange(int(offsets[-1]))
        sparse = SparseFeatures(
            {
                "user": JaggedIds.from_dense(self.user[rows, None]),
                "item": JaggedIds.from_dense(self.item[rows, None]),
                "history": JaggedIds(self.history[positions], offsets),
            }
        )
        return CTRBatch(self.dense[rows], sparse, self.labels[rows])


NEXT_TABLES = [TableSpec("item", NUM_ITEMS, ("item", "history"), "none")]
NEXT_FEATURES = ["item", "history"]


def empty_batch(features: list[str], num_dense: int) -> CTRBatch:
    """A batch of no row (a rank's empty last batch) of ``features`` and ``num_dense`` dense features."""
    sparse = SparseFeatures({name: JaggedIds.from_dense(torch.zeros(0, 1, dtype=torch.int64)) for name in features})
    return CTRBatch(torch.zeros(0, num_dense), sparse, torch.zeros(0))


def successor(items: torch.Tensor) -> torch.Tensor:
    """The item that follows each of ``items`` (a fixed permutation of 1 .. NUM_ITEMS - 1)."""
    return (items * 37 + 11) % (NUM_ITEMS - 1) + 1


@dataclass(frozen=True)
class NextItemData:
    """Each row: a history of ``MIN_LEN`` to ``MAX_LEN`` distinct items in random order, and as the row's item the
    successor of the history's last one. Which item comes last is all that predicts it: a mean of the history
    holds every item alike, whatever their order."""

    item: torch.Tensor
    history: torch.Tensor
    offsets: torch.Tensor

    @classmethod
    def make(cls, num_rows: int, seed: int) -> NextItemData:
        generator = torch.Generator().manual_seed(seed)
        lengths = torch.randint(MIN_LEN, MAX_LEN + 1, (num_rows,), generator=generator)
        histories = [torch.randperm(NUM_ITEMS - 1, generator=generator)[: int(n)] + 1 for n in lengths]
        last = torch.stack([history[-1] for history in histories])
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        return cls(successor(last), torch.cat(histories), offsets)

    def __len__(self) -> int:
        return len(self.item)

    def batch(self, rows: torch.Tensor) -> CTRBatch:
        starts, lengths = self.offsets[rows], torch.diff(self.offsets)[rows]
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        positions = torch.repeat_interleave(starts - offsets[:-1], lengths) + torch.arange(int(offsets[-1]))
        sparse = SparseFeatures(
            {
                "item": JaggedIds.from_dense(self.item[rows, None]),
                "history": JaggedIds(self.history[positions], offsets),
            }
        )
        return CTRBatch(torch.zeros(len(rows), 0), sparse, torch.ones(len(rows)))


@dataclass(frozen=True)
class OrderData(MembershipData):
    """``MembershipData``'s columns, but each candidate is one item of the history: its last item (label 1) or
    another (label 0), half the time each, as a user comes back to what they saw last. Every candidate is in the
    history alike; only the order of the history tells the labels apart."""

    @classmethod
    def make(cls, num_rows: int, seed: int) -> OrderData:
        generator = torch.Generator().manual_seed(seed)
        walks = NextItemData.make(num_rows, seed)
        lengths = torch.diff(walks.offsets)
        labels = torch.randint(0, 2, (num_rows,), generator=generator)
        other = (torch.rand(num_rows, generator=generator) * (lengths - 1)).long()  # any position but the last
        chosen = walks.offsets[:-1] + torch.where(labels == 1, lengths - 1, other)
        user = torch.randint(0, NUM_USERS, (num_rows,), generator=generator)
        dense = torch.randn(num_rows, NUM_DENSE, generator=generator)
        return cls(user, walks.history[chosen], walks.history, walks.offsets, dense, labels.float())


def cluster_rows(num_rows: int, seed: int, num_clusters: int = 10) -> NextItemData:
    """Histories of items of one cluster each (items ``c, c + 10, c + 20 ...`` for cluster ``c``), the row's item
    another of the same cluster: what the history is about predicts it, not which item came last."""
    generator = torch.Generator().manual_seed(seed)
    size = (NUM_ITEMS - 1) // num_clusters
    lengths = torch.randint(MIN_LEN, min(MAX_LEN, size) + 1, (num_rows,), generator=generator)
    clusters = torch.randint(1, num_clusters + 1, (num_rows,), generator=generator)
    members = [cluster + num_clusters * torch.randperm(size, generator=generator) for cluster in clusters]
    histories = [items[: int(n)] for items, n in zip(members, lengths)]
    targets = torch.stack([items[torch.randint(0, size, (1,), generator=generator)][0] for items in members])
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    return NextItemData(targets, torch.cat(histories), offsets)


def padded_rows(table: torch.Tensor, history: torch.Tensor, offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's sequence (``history`` cut by ``offsets``) looked up in ``table``, as serving gives it:
    ``[B, MAX_LEN, dim]`` with noise after a row's last (which must never be read), and the rows' lengths."""
    lengths = torch.diff(offsets)
    padded = torch.randn(len(lengths), MAX_LEN, table.shape[1], generator=torch.Generator().manual_seed(0))
    for row, length in enumerate(lengths.tolist()):
        padded[row, :length] = table[history[offsets[row] : offsets[row + 1]]]
    return padded, lengths


def exported(split: DenseForServing, folder: Path) -> torch.nn.Module:
    """``split``'s program as ``export`` writes it (``torch.export``, a dynamic batch size) and loads back."""
    program = _write_program(fsspec.filesystem("file"), str(folder), split)
    assert program == "dense.pt2", "torch.export could not trace the dense part"
    module: torch.nn.Module = torch.export.load(str(folder / program)).module()
    return module
