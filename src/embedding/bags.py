"""The bags a lookup of one shard group takes: the ids of every feature of its tables, checked or
hashed into their table's rows and moved to the group's buffer, and where each bag starts.

One lookup serves all the features of a group, so their bags are concatenated. On the CPU the ids
take one compiled pass (:mod:`embedding.kernels.grouping`; one-id bags' offsets another), then, where
the group's rows are all local (so that its ids are the update's), the sort the update needs: one sort
a batch, made where a train pipeline prepares the next batch ahead. On an accelerator, torch ops move
the ids, all features at once when they have as many ids and bags each (one id per sample, say), else a
feature at a time; its kernel sorts them on the device.
"""

from __future__ import annotations

import functools
import itertools

import torch

from embedding.features import JaggedIds, SparseFeatures
from embedding.kernels import SortedIds
from embedding.kernels.grouping import IdOutOfRange, group_ids, one_id_bag_offsets
from embedding.lookup import Bags
from embedding.sharding import ShardGroup
from embedding.table_config import EmbeddingTableConfig


class SparseFeatureError(ValueError):
    """Raised when the sparse features of a batch do not fit the tables that look them up."""


def group_bags(group: ShardGroup, features: SparseFeatures, sort: bool = False) -> Bags:
    """The bags of every feature of every table of ``group``, concatenated; ``sort``: with the ids sorted for
    the update too (CPU only; an accelerator's kernel sorts them on the device)."""
    pairs = table_features(group)
    jagged = [features[feature] for _, feature in pairs]
    buffer_offsets = [
        offset for shard, offset in zip(group.shards, group.buffer_offsets) for _ in shard.config.features
    ]
    weighted = any(feature.weights is not None for feature in jagged)
    scales = torch.cat([_weights_or_ones(feature) for feature in jagged]) if weighted else None
    uniform = len({(feature.ids.numel(), num_bags(table, feature)) for (table, _), feature in zip(pairs, jagged)}) == 1
    sorted_ids, one_id_offsets = None, None
    if jagged[0].ids.device.type == "cpu":
        ids, sorted_ids = compiled_ids(pairs, jagged, buffer_offsets, group.num_buffer_rows if sort else None)
        one_id_offsets = compiled_one_id_offsets(pairs, jagged) if uniform else None
    elif uniform:
        ids = uniform_ids(pairs, jagged, buffer_offsets)
    else:
        ids = ids_a_feature_at_a_time(pairs, jagged, buffer_offsets)
    if one_id_offsets is not None:
        offsets, one_id_per_bag = one_id_offsets, True
    elif uniform:
        offsets, one_id_per_bag = uniform_offsets(pairs, jagged)
    else:
        offsets, one_id_per_bag = jagged_offsets(pairs, jagged), False
    return Bags(ids, offsets, scales, one_id_per_bag, sorted_ids)


def num_bags(table: EmbeddingTableConfig, jagged: JaggedIds) -> int:
    return jagged.ids.numel() if table.pooling == "none" else jagged.batch_size


def table_features(group: ShardGroup) -> list[tuple[EmbeddingTableConfig, str]]:
    """Every (table, feature) pair of ``group``, in the order of its bags and outputs."""
    return [(shard.config, feature) for shard in group.shards for feature in shard.config.features]


def compiled_ids(
    pairs: list[tuple[EmbeddingTableConfig, str]],
    jagged: list[JaggedIds],
    buffer_offsets: list[int],
    buffer_rows: int | None,
) -> tuple[torch.Tensor, SortedIds | None]:
    """The features' ids as buffer rows, by the compiled pass; sorted too where ``buffer_rows`` is given."""
    ids = torch.cat([feature.ids.to(torch.int64) for feature in jagged])  # a copy, which the pass changes
    try:
        group_ids(
            ids,
            list(itertools.accumulate(feature.ids.numel() for feature in jagged)),
            [table.num_rows for table, _ in pairs],
            [table.out_of_range == "hash" for table, _ in pairs],
            [table.kind == "fixed" for table, _ in pairs],  # a hash table takes any id
            buffer_offsets,
        )
    except IdOutOfRange as out_of_range:
        (table, feature), feature_ids = pairs[out_of_range.feature], jagged[out_of_range.feature].ids
        low, high = (int(value) for value in torch.aminmax(feature_ids))
        raise _id_range_error(table, feature, low, high) from None
    return ids, None if buffer_rows is None else SortedIds.of(ids, buffer_rows)


def compiled_one_id_offsets(
    pairs: list[tuple[EmbeddingTableConfig, str]], jagged: list[JaggedIds]
) -> torch.Tensor | None:
    """On the CPU, the offsets of features that all have as many ids and bags, if every bag holds one id (else
    ``None``), by the compiled pass (:func:`embedding.kernels.grouping.one_id_bag_offsets`)."""
    if num_bags(pairs[0][0], jagged[0]) != jagged[0].ids.numel():
        return None
    pooled = [feature.offsets.to(torch.int64) for (table, _), feature in zip(pairs, jagged) if table.pooling != "none"]
    return one_id_bag_offsets(pooled, len(jagged) * jagged[0].ids.numel()) if pooled else None


def uniform_ids(
    pairs: list[tuple[EmbeddingTableConfig, str]], jagged: list[JaggedIds], buffer_offsets: list[int]
) -> torch.Tensor:
    """The ids of features that all have as many ids and bags, as the rows of a ``[features, ids]`` matrix: a few
    ops for them all rather than a few for each (26 features' took a fifteenth of a whole sparse step)."""
    device = jagged[0].ids.device
    ids = torch.stack([feature.ids.to(torch.int64) for feature in jagged])
    hashed = [table.out_of_range == "hash" for table, _ in pairs]
    if any(hashed):
        rows = torch.tensor([[table.num_rows] for table, _ in pairs], device=device)
        ids = torch.where(torch.tensor(hashed, device=device).unsqueeze(1), torch.remainder(ids, rows), ids)
    if ids.size(1) > 0 and pairs[0][0].kind == "fixed":  # a hash table takes any id
        # One read of the device for every feature's range: on a GPU each read waits for the queued work.
        lows, highs = torch.stack(ids.aminmax(dim=1)).tolist()
        for (table, feature), low, high in zip(pairs, lows, highs):
            _check_id_range(table, feature, low, high)
    if any(buffer_offsets):
        ids += _on_device(tuple(buffer_offsets), device).unsqueeze(1)
    return ids.flatten()


@functools.lru_cache(maxsize=64)
def _on_device(values: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """``values`` as a tensor on ``device``, made once: a copy from a list to a GPU at every step waits for the work
    queued before it."""
    return torch.tensor(values, device=device)


def ids_a_feature_at_a_time(
    pairs: list[tuple[EmbeddingTableConfig, str]], jagged: list[JaggedIds], buffer_offsets: list[int]
) -> torch.Tensor:
    """The ids of features of any sizes, a feature at a time."""
    ids = []
    for (table, feature), feature_jagged, buffer_offset in zip(pairs, jagged, buffer_offsets):
        feature_ids = feature_jagged.ids.to(torch.int64)
        if table.out_of_range == "hash":
            feature_ids = torch.remainder(feature_ids, table.num_rows)
        elif feature_ids.numel() > 0 and table.kind == "fixed":
            low, high = (int(value) for value in torch.aminmax(feature_ids))
            _check_id_range(table, feature, low, high)
        ids.append(feature_ids + buffer_offset if buffer_offset else feature_ids)
    return torch.cat(ids)


def uniform_offsets(
    pairs: list[tuple[EmbeddingTableConfig, str]], jagged: list[JaggedIds]
) -> tuple[torch.Tensor, bool]:
    """The bag offsets of features that all have as many ids and bags, and whether every bag holds one id."""
    device = jagged[0].ids.device
    num_features, num_ids, bags_per_feature = len(jagged), jagged[0].ids.numel(), num_bags(pairs[0][0], jagged[0])
    if bags_per_feature == num_ids:
        # Most often every bag holds one id: then the offsets are a range, built in one pass,
        # and the features' are compared with its start, all at once, rather than copied and moved.
        offsets = torch.arange(num_features * num_ids + 1, device=device)
        pooled = [
            feature.offsets.to(torch.int64) for (table, _), feature in zip(pairs, jagged) if table.pooling != "none"
        ]
        if not pooled or torch.equal(torch.stack(pooled), offsets[: bags_per_feature + 1].expand(len(pooled), -1)):
            return offsets, True

    offsets = torch.empty(num_features * bags_per_feature + 1, dtype=torch.int64, device=device)
    feature_offsets = offsets[:-1].view(num_features, bags_per_feature)
    torch.stack([_bag_starts(table, feature) for (table, _), feature in zip(pairs, jagged)], out=feature_offsets)
    feature_offsets += (torch.arange(num_features, device=device) * num_ids).unsqueeze(1)
    offsets[-1] = num_features * num_ids
    return offsets, False


def jagged_offsets(pairs: list[tuple[EmbeddingTableConfig, str]], jagged: list[JaggedIds]) -> torch.Tensor:
    """The bag offsets of features of any sizes, a feature at a time."""
    offsets, num_ids = [], 0
    for (table, _), feature_jagged in zip(pairs, jagged):
        offsets.append(_bag_starts(table, feature_jagged) + num_ids)
        num_ids += feature_jagged.ids.numel()
    offsets.append(torch.tensor([num_ids], device=jagged[0].ids.device))
    return torch.cat(offsets)


def _bag_starts(table: EmbeddingTableConfig, jagged: JaggedIds) -> torch.Tensor:
    """Where each bag of ``jagged`` starts among its ids."""
    if table.pooling == "none":  # every id is a bag of its own
        return torch.arange(jagged.ids.numel(), device=jagged.ids.device)
    return jagged.offsets[:-1].to(torch.int64)


def _weights_or_ones(jagged: JaggedIds) -> torch.Tensor:
    if jagged.weights is None:
        return torch.ones_like(jagged.ids, dtype=torch.float32)
    return jagged.weights.to(torch.float32)


def _check_id_range(table: EmbeddingTableConfig, feature: str, low: int, high: int) -> None:
    """Raise unless the ids of ``feature``, from ``low`` to ``high``, are rows of ``table``."""
    if low < 0 or high >= table.num_rows:
        raise _id_range_error(table, feature, low, high)


def _id_range_error(table: EmbeddingTableConfig, feature: str, low: int, high: int) -> SparseFeatureError:
    return SparseFeatureError(
        f"Ids of feature '{feature}' must be in [0, {table.num_rows}) as table '{table.name}' has "
        f"{table.num_rows} rows, but contain {low if low < 0 else high} instead."
    )


__all__ = ["SparseFeatureError", "group_bags", "num_bags", "table_features"]
