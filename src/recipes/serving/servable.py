"""The split of a model into sparse lookups and a dense part, which ``export`` needs and a model declares.

A serving system holds the tables in its own store (a key-value service, a parameter server) and
runs only the dense part: it looks each feature's ids up in that feature's table, pools the rows,
and hands the pooled vectors and the dense features to a program. The framework cannot find that
cut by itself (a model may pool a feature in two tables, as a factorization machine's weights and
vectors do, or mix the dense features in anywhere), so a model that can be served says where it is
by ``dense_for_serving``, as TorchRec's inference models keep their sparse arch apart from their
dense one. A model that reads a behaviour sequence in order (a transformer over the latest items) takes that
feature's rows unpooled instead: the serving system pads them, oldest first, and passes each row's length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from torch import nn


@dataclass(frozen=True)
class PooledInput:
    """One pooled vector the dense part takes: ``feature``'s ids looked up in ``table`` and pooled.

    ``pooling``: ``sum`` (of the rows, each times its id's weight if the feature has weights) or
    ``mean`` (that sum over the bag's number of ids, at least 1). An id the table holds no row for
    reads as zeros, as a hash table's lookups do.
    """

    table: str
    feature: str
    dim: int
    pooling: Literal["sum", "mean"]


@dataclass(frozen=True)
class SequenceInput:
    """One sequence the dense part takes unpooled: ``feature``'s ids looked up in ``table``, a row's rows in order
    (the oldest first, as the reader keeps them), ``[B, max_len, dim]`` with zeros after a row's last, and the
    row's number of ids ``[B]`` (int64, at most ``max_len``: a longer sequence keeps its latest ``max_len``)."""

    table: str
    feature: str
    dim: int
    max_len: int


@dataclass(frozen=True)
class ItemVectors:
    """A retrieval model's item tower: ``tower`` maps the rows of ``table`` (the ids of ``feature``, the items) to
    the vectors that the query vectors are scored against, ``[N, dim]``. ``export`` writes every item's vector
    (``items.parquet``), which a serving system puts in its nearest-neighbour index."""

    table: str
    feature: str
    tower: nn.Module
    dim: int


@dataclass(frozen=True)
class DenseForServing:
    """The dense part of a model and what it takes.

    ``module.forward(dense, pooled)`` maps the dense features ``[B, num_dense]`` (float32) and the
    pooled vectors (a list of ``[B, dim]`` float32 tensors, in the order of ``inputs``) to the score
    of every row, ``[B]``: what ``predict`` writes (a probability for a click model), not a logit; or, for a
    model of several outputs (tasks), ``[B, len(outputs)]``, column ``k`` the score named ``outputs[k]``; or, for a
    retrieval model (``items``), each row's query vector ``[B, items.dim]``, whose dot product with an item's
    vector, over ``temperature``, is the logit of that item.

    With ``sequences``, the module takes two lists more: ``forward(dense, pooled, sequences, lengths)``, each
    sequence's padded rows ``[B, max_len, dim]`` and its lengths ``[B]``, in the order of ``sequences``.
    """

    module: nn.Module
    num_dense: int
    inputs: tuple[PooledInput, ...]
    outputs: tuple[str, ...] = ()
    items: ItemVectors | None = None
    temperature: float = 1.0
    sequences: tuple[SequenceInput, ...] = ()

    def lookups(self) -> tuple[PooledInput | SequenceInput, ...]:
        """Every input a serving system looks up in a table: the pooled ones, then the sequences."""
        return (*self.inputs, *self.sequences)


@runtime_checkable
class ServableModel(Protocol):
    """A model whose dense part can be exported apart from its tables."""

    def dense_for_serving(self) -> DenseForServing:
        """The dense part, sharing this model's parameters (no copy)."""
        ...
