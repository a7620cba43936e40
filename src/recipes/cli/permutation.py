"""A split held in memory, and copies of it with one feature's values moved to other rows: the data of
permutation importance (``python -m recipes importance``).

A feature is permuted across all the split's rows, not within a batch: row ``p`` of the copy gets the
bag (the list of ids, with their weights) that row ``perm[p]`` has, for one permutation ``perm`` of
every row, so that the feature keeps its distribution and loses only its link to the label and the
other features. Batches are read once and held, so every pass scores the same rows in the same
order, and the copies share every other field with the held batches: a pass costs one feature's
values twice (all its rows side by side, then permuted), on top of the held split.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from embedding.features import JaggedIds, SparseFeatures
from embedding.memory import available_bytes
from recipes.errors import UserError
from recipes.training.data_reader import DataReader
from recipes.training.protocols import SparseFeatureBatch

Steps = list[list[SparseFeatureBatch]]
"""A split's steps, each the list of its micro-batches, as a reader yields them."""

MEMORY_SHARE = 3
"""The held split may take 1/MEMORY_SHARE of the memory available when reading starts: the rest is for a pass's
copies of one feature and the model's activations."""

DENSE_PREFIX = "dense_"
"""Column ``j`` of a batch's ``dense`` tensor is the feature ``dense_j``: the framework knows no schema's names."""


def hold_split(reader: DataReader[Any], split: str, budget: int | None = None) -> Steps:
    """Every step of one pass of ``reader``, each batch checked to be a ``SparseFeatureBatch``; refused once the
    batches take more than ``budget`` bytes (default: 1/MEMORY_SHARE of the host memory available now)."""
    if budget is None:
        available = available_bytes(torch.device("cpu"))
        budget = None if available is None else available // MEMORY_SHARE
    steps: Steps = []
    held, rows = 0, 0
    for batches in reader:
        for batch in batches:
            _check_batch(batch)
            held += _nbytes(batch)
            rows += num_rows(batch)
        steps.append(batches)
        if budget is not None and held > budget:
            raise UserError(
                f"The {split} split must fit in a third of the memory available ({_gib(budget * MEMORY_SHARE)}) to "
                f"be held while each feature is permuted across its rows, but its first {rows:,} rows already take "
                f"{_gib(held)}: score a split of fewer rows."
            )
    reader.reset()
    return steps


def _check_batch(batch: object) -> None:
    if not (
        dataclasses.is_dataclass(batch)
        and isinstance(batch, SparseFeatureBatch)
        and isinstance(batch.sparse, SparseFeatures)
    ):
        what = f"a {type(batch).__name__}"
        if hasattr(batch, "sparse"):
            what += f" whose `sparse` is a {type(batch.sparse).__name__}"
        raise UserError(
            "To permute features, a batch must be a dataclass with its SparseFeatures in a `sparse` field "
            f"(recipes.training.protocols.SparseFeatureBatch), but is {what} instead."
        )


def num_rows(batch: SparseFeatureBatch) -> int:
    """The rows of a batch: its sparse features' batch size, or its dense rows where it has no sparse feature."""
    if len(batch.sparse):
        return batch.sparse.batch_size
    dense = _dense(batch)
    return 0 if dense is None else int(dense.shape[0])


def feature_names(steps: Steps) -> list[str]:
    """The features a pass may permute: the sparse ones by name, then ``dense_0``, ``dense_1``... The same in
    every batch, or the recipe's batches cannot be permuted as one table."""
    batches = [batch for batches in steps for batch in batches]
    layouts = {(tuple(batch.sparse), _num_dense(batch)) for batch in batches}
    if len(layouts) > 1:
        shown = sorted(f"{list(names)} + {num_dense} dense" for names, num_dense in layouts)
        raise UserError(f"Every batch of the split must have the same features, but they have {shown} instead.")
    names, num_dense = next(iter(layouts), ((), 0))
    features = [*names, *(f"{DENSE_PREFIX}{j}" for j in range(num_dense))]
    if not features:
        raise UserError("To permute features, a batch must have sparse or dense features, but has none.")
    return features


def permuted(steps: Steps, feature: str, generator: torch.Generator) -> Steps:
    """A copy of ``steps`` with ``feature``'s values moved by one permutation of all their rows, drawn from
    ``generator``; every other field is the held batches' own."""
    batches = [batch for batches in steps for batch in batches]
    sizes = [num_rows(batch) for batch in batches]
    order = torch.randperm(sum(sizes), generator=generator)
    if feature in batches[0].sparse:
        bags = _split_bags(_permute_bags(_concat_bags([b.sparse[feature] for b in batches]), order), sizes)
        copies = [
            _replaced(batch, sparse=SparseFeatures({**batch.sparse, feature: bag}))
            for batch, bag in zip(batches, bags, strict=True)
        ]
    else:
        column = int(feature.removeprefix(DENSE_PREFIX))
        dense = torch.cat([_dense_of(batch) for batch in batches])
        dense[:, column] = dense[order, column]
        copies = [_replaced(batch, dense=rows) for batch, rows in zip(batches, dense.split(sizes), strict=True)]
    copied = iter(copies)
    return [[next(copied) for _ in batches] for batches in steps]


def _concat_bags(parts: Sequence[JaggedIds]) -> JaggedIds:
    """The bags of every batch, one after the other, as one jagged feature."""
    lengths = torch.cat([part.offsets.diff() for part in parts])
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    ids = torch.cat([part.ids for part in parts])
    weights = [part.weights for part in parts if part.weights is not None]
    if weights and len(weights) != len(parts):
        raise UserError("A feature must have weights in every batch or in none, but has them in some only.")
    return JaggedIds(ids, offsets, torch.cat(weights) if weights else None)


def _permute_bags(bags: JaggedIds, order: torch.Tensor) -> JaggedIds:
    """Row ``p`` gets the bag of row ``order[p]``."""
    lengths = bags.offsets.diff()[order]
    offsets = torch.zeros(len(order) + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    within = torch.arange(int(offsets[-1])) - torch.repeat_interleave(offsets[:-1], lengths)
    positions = torch.repeat_interleave(bags.offsets[:-1][order], lengths) + within
    weights = None if bags.weights is None else bags.weights[positions]
    return JaggedIds(bags.ids[positions], offsets, weights)


def _split_bags(bags: JaggedIds, sizes: Sequence[int]) -> list[JaggedIds]:
    """The rows of ``bags`` back into batches of ``sizes`` rows."""
    parts, row = [], 0
    for size in sizes:
        start, stop = int(bags.offsets[row]), int(bags.offsets[row + size])
        weights = None if bags.weights is None else bags.weights[start:stop]
        parts.append(JaggedIds(bags.ids[start:stop], bags.offsets[row : row + size + 1] - start, weights))
        row += size
    return parts


def _replaced(batch: SparseFeatureBatch, **changes: object) -> SparseFeatureBatch:
    """A copy of ``batch`` with ``changes``: a dataclass, as ``hold_split`` checked."""
    return dataclasses.replace(batch, **changes)  # type: ignore[type-var]


def _dense_of(batch: object) -> torch.Tensor:
    dense = _dense(batch)
    assert dense is not None, "feature_names names dense columns of batches that have them only"
    return dense


def _dense(batch: object) -> torch.Tensor | None:
    dense = getattr(batch, "dense", None)
    return dense if isinstance(dense, torch.Tensor) and dense.dim() == 2 else None


def _num_dense(batch: object) -> int:
    dense = _dense(batch)
    return 0 if dense is None else int(dense.shape[1])


def _nbytes(value: object) -> int:
    """The bytes of the tensors a batch holds, through dataclasses, mappings, lists and tuples."""
    if isinstance(value, torch.Tensor):
        return value.nbytes
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return sum(_nbytes(getattr(value, field.name)) for field in dataclasses.fields(value))
    if isinstance(value, Mapping):
        return sum(_nbytes(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(item) for item in value)
    return 0


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / 2**30:.1f} GiB"


class HeldReader(DataReader[Any]):
    """The held steps read again, in the same order, on every pass."""

    def __init__(self, steps: Steps) -> None:
        self._steps = steps
        self._position = 0

    def __next__(self) -> list[Any]:
        if self._position >= len(self._steps):
            raise StopIteration
        self._position += 1
        return self._steps[self._position - 1]

    def reset(self) -> None:
        self._position = 0

    def state_dict(self) -> dict[str, Any]:
        return {"position": self._position}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self._position = int(state_dict["position"])
