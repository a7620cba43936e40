"""Pooled lookups of one shard group, local or over a gang, and the gradients they record.

Every lookup is a weighted sum per bag: ``out[b] = sum_k scale[k] * weight[ids[k]]`` over the
ids ``k`` of bag ``b``, ``weight`` being the group's buffer. Mean pooling and unpooled rows are
built on it by the collection. A lookup object serves one forward and its backward,
remembering in between what the backward needs to route gradients to the rows' owners;
:func:`forward_all` and :func:`backward_all` run a step's lookups, the all-to-all ones together.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from embedding.gathered_grads import GradLayout, LocalGrads, gather_grads
from embedding.id_hashing import owner_ranks
from embedding.kernels import SortedIds
from embedding.kernels.cpu import count_distinct, sum_by_id
from embedding.kernels.half_pooling import pooled_half_rows
from embedding.sharding import GradRecord, ShardGroup
from embedding.tiers.row_cache import StagedRecords
from gang import Gang


@dataclass(frozen=True)
class Bags:
    """The bags this rank looks up in one group: bag ``b`` holds ``ids[offsets[b]:offsets[b + 1]]``,
    each weighted by ``scales`` (``None``: by 1). The ids are rows of the group's buffer when
    every row is local, else global rows of the group's one table; checked or hashed already.

    ``one_id_per_bag`` says that ``offsets`` is known to be ``0, 1, ..., len(ids)``, which spares
    ``bag_of_each_id`` a pass over it. ``sorted_ids``: the ids sorted for the update already.
    """

    ids: torch.Tensor
    offsets: torch.Tensor
    scales: torch.Tensor | None
    one_id_per_bag: bool = False
    sorted_ids: SortedIds | None = None

    @property
    def num_bags(self) -> int:
        return self.offsets.numel() - 1

    def bag_of_each_id(self) -> torch.Tensor:
        if self.one_id_per_bag:
            return self.offsets[:-1]
        bags = torch.arange(self.num_bags, device=self.ids.device)
        if self.num_bags == self.ids.numel() and torch.equal(self.offsets[:-1], bags):
            return bags  # One id per bag, as for most Criteo-style features: no repeat needed.
        return torch.repeat_interleave(bags, torch.diff(self.offsets), output_size=self.ids.numel())


class TableLookup(ABC):
    """One pooled lookup of one group: ``forward`` returns ``[num_bags, dim]`` and ``backward``
    takes its gradient, in pieces that concatenate to ``[num_bags, dim]`` (one per feature),
    and records the rows' gradients on the groups that own them."""

    staged: StagedRecords | None = None
    """A tiered group's records read ahead for this lookup (by a train pipeline)."""

    @abstractmethod
    def forward(self, bags: Bags) -> torch.Tensor: ...

    @abstractmethod
    def backward(self, grad_pieces: Sequence[torch.Tensor]) -> None: ...


def make_lookup(group: ShardGroup, gang: Gang, training: bool) -> TableLookup:
    """The lookup for ``group``: local when this rank holds its whole tables, else all-to-all.

    ``training`` lets a hash table's lookup admit and insert ids; otherwise it only finds them.
    """
    if gang.size == 1:
        return LocalLookup(group, training)
    if not sends_ids(group, gang):
        return ReplicatedLookup(group, gang, training)
    return AllToAllLookup(group, gang, training)


def sends_ids(group: ShardGroup, gang: Gang) -> bool:
    """Whether a lookup of ``group`` sends ids to other ranks of ``gang``: its tables are split over several."""
    return gang.size > 1 and group.placement != "replicated"


def _readable_in_place(grad_pieces: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """The features' gradients as the CPU kernels read them, in place: only a piece whose columns are strided (an
    expanded gradient, say) is copied."""
    return tuple(p if p.size(1) <= 1 or p.stride(1) == 1 else p.contiguous() for p in grad_pieces)


def _local_rows(
    group: ShardGroup, ids: torch.Tensor, row_start: int, training: bool, staged: StagedRecords | None = None
) -> torch.Tensor:
    """The rows of ``group``'s buffer that this rank's share of ``ids`` (global rows, or a hash table's ids) read:
    in a tiered group, the places of the cache they were brought into (with the records ``staged`` ahead)."""
    if group.dynamic is not None:
        if group.tier is None:
            return group.dynamic.rows(ids, group.weight, group.optimizer_state, training)
        return _hash_places(group, ids, training)
    rows = ids - row_start if row_start else ids
    return group.places_of(rows, training, staged) if group.tier is not None else rows


def _hash_places(group: ShardGroup, ids: torch.Tensor, training: bool) -> torch.Tensor:
    """The cache places of a tiered hash table's ids: their slots brought in, an id without a slot reading the
    zero place (the default row), and a slot given to a new id starting afresh once in the cache."""
    assert group.dynamic is not None and group.tier is not None
    slots, inserted = group.dynamic.look_up(ids, training)
    places = torch.full_like(slots, group.dynamic.default_row)
    found = slots >= 0
    places[found] = group.places_of(slots[found], training)
    if inserted.numel():  # brought in with the last id's row
        group.dynamic.reset(inserted, group.places_of(inserted, training), group.weight, group.optimizer_state)
    return places


def _done_reading(group: ShardGroup, places: torch.Tensor, training: bool) -> None:
    """After an evaluation lookup of a tiered group has read its rows: unpin them (a training lookup's stay pinned
    until the update)."""
    if group.tier is not None and not training:
        group.tier.release([places.cpu().numpy()])


def staged_rows(group: ShardGroup, rows: torch.Tensor) -> StagedRecords | None:
    """The records of ``rows`` (of the buffer) that a tiered ``group``'s cache lacks, read now for a later lookup."""
    return group.tier.prefetch(rows) if group.tier is not None else None


class LocalLookup(TableLookup):
    """Every row is on this rank: no communication."""

    def __init__(self, group: ShardGroup, training: bool) -> None:
        self._group = group
        self._training = training
        self._bags: Bags | None = None
        self._given: Bags | None = None
        """The bags as given: rows of the buffer (sorted, where sorted), before a tiered group's places."""

    def forward(self, bags: Bags) -> torch.Tensor:
        self._given = bags
        if self._group.dynamic is not None or self._group.tier is not None:
            rows = _local_rows(self._group, bags.ids, 0, self._training, self.staged)
            bags = Bags(rows, bags.offsets, bags.scales, bags.one_id_per_bag)
        self._bags = bags
        pooled = _weighted_sum(self._group.weight, bags.ids, bags.offsets, bags.scales, bags.one_id_per_bag)
        _done_reading(self._group, bags.ids, self._training)
        return pooled

    def backward(self, grad_pieces: Sequence[torch.Tensor]) -> None:
        self._group.record(self._local_record(_readable_in_place(grad_pieces)))

    def _local_record(self, grad_rows: tuple[torch.Tensor, ...]) -> GradRecord:
        assert self._bags is not None, "`backward` runs after `forward`."
        bags = self._bags
        return GradRecord(bags.ids, grad_rows, bags.bag_of_each_id(), bags.scales, bags.sorted_ids)


class ReplicatedLookup(LocalLookup):
    """Every rank holds every row and looks up locally; in backward, every rank records the
    gradients of all ranks, in rank order, so that every replica applies the same update."""

    def __init__(self, group: ShardGroup, gang: Gang, training: bool) -> None:
        super().__init__(group, training)
        self._gang = gang
        self._layout: GradLayout | None = None

    def forward(self, bags: Bags) -> torch.Tensor:
        pooled = super().forward(bags)
        if self._training:
            # What the backward sends is known now and travels while the step computes: a gloo collective
            # costs about 1.4 ms, mostly latency, which the step need not wait out. With the ids sorted (on the
            # CPU), a rank sends each distinct id once, with its gradient summed.
            if bags.sorted_ids is not None:
                distinct = count_distinct(bags.sorted_ids)
                self._layout = GradLayout(self._gang, distinct, distinct, sends_bags=False, sends_scales=False)
            else:
                sends_bags, sends_scales = not bags.one_id_per_bag, bags.scales is not None
                self._layout = GradLayout(self._gang, bags.num_bags, bags.ids.numel(), sends_bags, sends_scales)
        return pooled

    def backward(self, grad_pieces: Sequence[torch.Tensor]) -> None:
        # The rows as given travel: a tiered group's places are this rank's own, so each rank finds its places for
        # every rank's rows once they are here.
        assert self._layout is not None and self._given is not None, "A training forward made the layout."
        bags, weight = self._given, self._group.weight
        pieces = _readable_in_place(grad_pieces)
        if bags.sorted_ids is not None:
            distinct = self._layout.num_rows
            ids, sums = bags.ids.new_empty(distinct), weight.new_empty((distinct, weight.size(1)), dtype=torch.float32)
            sum_by_id(bags.sorted_ids, pieces, bags.bag_of_each_id(), bags.scales, ids, sums)
            local = LocalGrads(ids, [sums], None, None)
        else:
            bag_of_each_id = bags.bag_of_each_id() if self._layout.sends_bags else None
            local = LocalGrads(bags.ids, pieces, bag_of_each_id, bags.scales)
        record = gather_grads(self._gang, local, self._layout, weight.size(1))
        if self._group.tier is not None:
            record = replace(record, ids=self._group.places_of(record.ids, training=True))
        self._group.record(record)


class AllToAllLookup(TableLookup):
    """The group's one table lives in row ranges over the ranks (row-wise, or table-wise: one
    rank holds the whole range), or, for a hash table, by a hash of the id.

    Forward, in phases: bucketize the ids by owner; exchange counts; exchange ids and their
    bags and scales; every owner pools what it received into partial sums, one per (requester,
    bag); exchange the partial sums back; each requester adds its partial sums into its bags.
    Backward sends each partial sum's gradient back to its owner, which records it. Every
    exchange serves all the tables of a step at once (:func:`look_up_all`): four collectives a
    step, not four per table.
    """

    def __init__(self, group: ShardGroup, gang: Gang, training: bool) -> None:
        (self._shard,) = group.shards
        self._group = group
        self._gang = gang
        self._training = training

    def forward(self, bags: Bags) -> torch.Tensor:
        (pooled,) = look_up_all(self._gang, [self], [bags])
        return pooled

    def backward(self, grad_pieces: Sequence[torch.Tensor]) -> None:
        record_all(self._gang, [self], [grad_pieces])

    def _outgoing(self, bags: Bags) -> tuple[torch.Tensor, torch.Tensor]:
        """Each id with its bag and scale bits, grouped by owner (``[ids, 3]``), and how many go to each rank."""
        # Sorting stably keeps each owner's ids in bag order, so the ids of one bag at one owner
        # are contiguous: one partial sum.
        owner = self._owners(bags.ids)
        order = torch.argsort(owner, stable=True)
        sent_owner, sent_bag = owner[order], bags.bag_of_each_id()[order]
        scales = bags.scales[order] if bags.scales is not None else torch.ones(order.numel(), device=order.device)
        send_counts = torch.bincount(owner, minlength=self._gang.size)
        starts = _partial_bag_starts(sent_bag, _segment_starts(send_counts))
        self._num_bags = bags.num_bags
        self._partial_bag_target = sent_bag[starts]
        self._partials_per_owner = torch.bincount(sent_owner[starts], minlength=self._gang.size).tolist()
        payload = torch.stack([bags.ids[order], sent_bag, scales.view(torch.int32).to(torch.int64)], dim=1)
        return payload, send_counts

    def _pool_received(self, recv_counts: torch.Tensor, payload: torch.Tensor) -> torch.Tensor:
        """The partial sums of the ids received (``recv_counts[k]`` from rank ``k``), grouped by requester."""
        recv_ids, recv_bag, scale_bits = payload.unbind(1)
        self._recv_scales = scale_bits.to(torch.int32).view(torch.float32).contiguous()
        recv_starts = _partial_bag_starts(recv_bag, _segment_starts(recv_counts))
        self._local_ids = _local_rows(
            self._group, recv_ids.contiguous(), self._shard.row_start, self._training, self.staged
        )
        self._partial_of_id = torch.cumsum(recv_starts, 0) - 1
        partial_offsets = torch.cat(
            [torch.nonzero(recv_starts).flatten(), torch.tensor([recv_ids.numel()], device=recv_ids.device)]
        )
        partials = _weighted_sum(self._group.weight, self._local_ids, partial_offsets, self._recv_scales)
        _done_reading(self._group, self._local_ids, self._training)
        requester = torch.repeat_interleave(torch.arange(self._gang.size, device=recv_ids.device), recv_counts)
        self._partials_per_requester = torch.bincount(requester[recv_starts], minlength=self._gang.size).tolist()
        return partials

    def _add_up(self, received: torch.Tensor) -> torch.Tensor:
        pooled = torch.zeros((self._num_bags, self._shard.config.dim), dtype=received.dtype, device=received.device)
        return pooled.index_add_(0, self._partial_bag_target, received)

    @property
    def gang(self) -> Gang:
        return self._gang

    def _owners(self, ids: torch.Tensor) -> torch.Tensor:
        """The rank holding each id: by row range, or by a hash of the id for a hash table."""
        if self._gang.size == 1:  # no hashing, and no round trip through the host for a GPU's ids
            return torch.zeros_like(ids)
        if self._group.dynamic is not None:
            owners = owner_ranks(ids.detach().to("cpu", torch.int64).numpy(), self._gang.size)
            return torch.from_numpy(owners).to(ids.device)
        inner_bounds = torch.tensor(self._shard.sharding.row_bounds[1:-1], device=ids.device)
        return torch.bucketize(ids, inner_bounds, right=True)


def forward_all(
    lookups: Sequence[TableLookup], bags: Sequence[Bags], sent: SentIds | None = None
) -> list[torch.Tensor]:
    """Every lookup's pooled rows, in order; the all-to-all ones exchange together.

    ``sent`` holds their ids already at their owners (see :func:`send_all_ids`); ``None``: send them now.
    """
    exchanged = _all_to_all_lookups(lookups)
    pooled: dict[int, torch.Tensor] = {}
    if exchanged:
        gang = next(iter(exchanged.values())).gang
        looked_up = look_up_all(gang, list(exchanged.values()), [bags[i] for i in exchanged], sent)
        pooled = dict(zip(exchanged, looked_up))
    return [pooled[i] if i in pooled else lookup.forward(bags[i]) for i, lookup in enumerate(lookups)]


def send_all_ids(gang: Gang, lookups: Sequence[TableLookup], bags: Sequence[Bags]) -> SentIds | None:
    """The ids of the all-to-all ones among ``lookups`` sent to their owners over ``gang`` (``None``: there are none).

    ``gang`` may be another process group of the same ranks than the lookups' own: a train
    pipeline sends the next step's ids on one while this step computes and exchanges on the other.
    """
    exchanged = _all_to_all_lookups(lookups)
    if not exchanged:
        return None
    return send_ids(gang, list(exchanged.values()), [bags[i] for i in exchanged])


def backward_all(lookups: Sequence[TableLookup], grad_pieces: Sequence[Sequence[torch.Tensor]]) -> None:
    """Every lookup's backward, in order; the all-to-all ones exchange together, first."""
    exchanged = _all_to_all_lookups(lookups)
    if exchanged:
        gang = next(iter(exchanged.values())).gang
        record_all(gang, list(exchanged.values()), [grad_pieces[i] for i in exchanged])
    for i, lookup in enumerate(lookups):
        if i not in exchanged:
            lookup.backward(grad_pieces[i])


def _all_to_all_lookups(lookups: Sequence[TableLookup]) -> dict[int, AllToAllLookup]:
    """The lookups that exchange ids over the gang, by position."""
    return {i: lookup for i, lookup in enumerate(lookups) if isinstance(lookup, AllToAllLookup)}


@dataclass(frozen=True)
class SentIds:
    """The ids of a step's all-to-all lookups, at their owners: ``recv_counts[k, i]`` ids of lookup ``i``
    came from rank ``k``, and ``payloads[i]`` holds them (with their bags and scales), grouped by rank."""

    recv_counts: torch.Tensor
    payloads: list[torch.Tensor]


def send_ids(gang: Gang, lookups: Sequence[AllToAllLookup], bags: Sequence[Bags]) -> SentIds:
    """Every lookup's ids sent to their owners: the counts, then the ids of all the lookups, in one collective each."""
    outgoing = [lookup._outgoing(table_bags) for lookup, table_bags in zip(lookups, bags)]
    send_counts = torch.stack([counts for _, counts in outgoing], dim=1)  # [ranks, lookups]
    recv_counts = torch.empty_like(send_counts)
    gang.all_to_all(recv_counts, send_counts)
    send_rows, recv_rows = send_counts.t().tolist(), recv_counts.t().tolist()
    return SentIds(recv_counts, _exchange_many(gang, [payload for payload, _ in outgoing], send_rows, recv_rows))


def look_up_all(
    gang: Gang, lookups: Sequence[AllToAllLookup], bags: Sequence[Bags], sent: SentIds | None = None
) -> list[torch.Tensor]:
    """The pooled rows of every lookup, its ``bags`` looked up at their owners: the counts, the ids and the
    partial sums of all the lookups each travel in one collective (a gloo collective cost 1.4 ms on the
    development machine; 26 tables exchanged one by one took 150 of them a step). ``sent``: the ids
    were sent already, by :func:`send_ids` on these lookups."""
    if sent is None:
        sent = send_ids(gang, lookups, bags)
    partials = [lookup._pool_received(sent.recv_counts[:, i], sent.payloads[i]) for i, lookup in enumerate(lookups)]
    received = _exchange_many(
        gang,
        partials,
        [lookup._partials_per_requester for lookup in lookups],
        [lookup._partials_per_owner for lookup in lookups],
    )
    return [lookup._add_up(rows) for lookup, rows in zip(lookups, received)]


def record_all(gang: Gang, lookups: Sequence[AllToAllLookup], grad_pieces: Sequence[Sequence[torch.Tensor]]) -> None:
    """Send the gradient of every partial sum of every lookup back to its owner (one collective), which records it."""
    grads = [
        lookup._group.concat_grad_rows(pieces)[lookup._partial_bag_target]
        for lookup, pieces in zip(lookups, grad_pieces)
    ]
    received = _exchange_many(
        gang,
        grads,
        [lookup._partials_per_owner for lookup in lookups],
        [lookup._partials_per_requester for lookup in lookups],
    )
    for lookup, recv_grads in zip(lookups, received):
        lookup._group.record(GradRecord(lookup._local_ids, (recv_grads,), lookup._partial_of_id, lookup._recv_scales))


def _weighted_sum(
    weight: torch.Tensor,
    ids: torch.Tensor,
    offsets: torch.Tensor,
    scales: torch.Tensor | None,
    one_id_per_bag: bool = False,
) -> torch.Tensor:
    """The bags' weighted sums, in float32 whatever the rows' dtype: half-precision rows are widened as they are
    read (each id's row once, never the whole table), so that the sums round once, in float32, as a float32
    table's do. On the CPU one compiled pass reads, widens and pools them (:mod:`embedding.kernels.half_pooling`);
    elsewhere bags of one id each are their widened rows (scaled): no second pass over the widened copy."""
    if weight.dtype == torch.float32:
        return F.embedding_bag(ids, weight, offsets, mode="sum", per_sample_weights=scales, include_last_offset=True)
    if weight.device.type == "cpu":
        return pooled_half_rows(weight, ids, offsets, scales)
    rows = weight.index_select(0, ids).float()
    if one_id_per_bag:
        return rows if scales is None else rows.mul_(scales.unsqueeze(1))
    positions = torch.arange(ids.numel(), device=ids.device)
    return F.embedding_bag(positions, rows, offsets, mode="sum", per_sample_weights=scales, include_last_offset=True)


def _segment_starts(counts: torch.Tensor) -> torch.Tensor:
    """The first position of each non-empty segment of a tensor cut into ``counts`` pieces."""
    starts = torch.cumsum(counts, 0) - counts
    return starts[counts > 0]


def _partial_bag_starts(bag: torch.Tensor, segment_starts: torch.Tensor) -> torch.Tensor:
    """Where a new partial bag begins: at a change of bag or at the start of a segment (rank)."""
    starts = torch.ones_like(bag, dtype=torch.bool)
    starts[1:] = bag[1:] != bag[:-1]
    starts[segment_starts] = True
    return starts


def _exchange(gang: Gang, tensor: torch.Tensor, send_sizes: Sequence[int], recv_sizes: Sequence[int]) -> torch.Tensor:
    output = tensor.new_empty((sum(recv_sizes), *tensor.shape[1:]))
    gang.all_to_all(output, tensor, recv_sizes, send_sizes)
    return output


def _exchange_many(
    gang: Gang,
    tensors: Sequence[torch.Tensor],
    send_rows: Sequence[Sequence[int]],
    recv_rows: Sequence[Sequence[int]],
) -> list[torch.Tensor]:
    """``tensors`` exchanged in one all-to-all: tensor ``i`` sends ``send_rows[i][k]`` rows to rank ``k``
    (its rows grouped by destination) and gets back ``recv_rows[i][k]`` rows from rank ``k``, grouped by
    source. Rows of different widths travel flattened, in (rank, tensor) order."""
    dtype = tensors[0].dtype if all(t.dtype == tensors[0].dtype for t in tensors) else torch.float32
    widths = [math.prod(t.shape[1:]) for t in tensors]
    ranks = range(gang.size)
    sent = [
        torch.split(t.to(dtype).reshape(-1), [rows * width for rows in counts])
        for t, counts, width in zip(tensors, send_rows, widths)
    ]
    send_sizes = [sum(counts[k] * width for counts, width in zip(send_rows, widths)) for k in ranks]
    recv_sizes = [sum(counts[k] * width for counts, width in zip(recv_rows, widths)) for k in ranks]
    flat = torch.cat([pieces[k] for k in ranks for pieces in sent])
    chunks = torch.split(
        _exchange(gang, flat, send_sizes, recv_sizes),
        [counts[k] * width for k in ranks for counts, width in zip(recv_rows, widths)],
    )
    return [torch.cat(chunks[i :: len(tensors)]).view(-1, *tensor.shape[1:]) for i, tensor in enumerate(tensors)]
