"""The metrics reduced over a real 2-process gloo gang equal their hand and NumPy references over all the rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from support.gloo_jobs import free_port, gloo_gang, start_ranks
from support.metric_references import (
    CLICK_METRICS,
    CLICK_TOLERANCE,
    click_data,
    numpy_value,
    rank_data,
    rank_sum_auc,
    update_in_batches,
)
from units import BinaryAUC, Mean, MetricBag, Sum

# Two ranks, real gloo --------------------------------------------------------------------------


def compute_on_two_ranks(rank: int, world_size: int, port: int, out_dir: str) -> None:
    with gloo_gang(rank, world_size, port) as gang:
        bag = MetricBag(gang)
        for name, metric in [("auc", BinaryAUC()), ("mean", Mean()), ("sum", Sum()), ("only_rank_0", Sum())]:
            bag.register(name, metric)
        scores, labels, weights = rank_data(rank)
        bag["auc"].update(scores, labels)
        bag["mean"].update(scores, weight=weights)
        bag["sum"].update(scores)
        if rank == 0:
            bag["only_rank_0"].update(torch.tensor(1.0))
        values = bag.compute()
        Path(out_dir, f"rank_{rank}.json").write_text(json.dumps(values))


def test_metrics_reduce_over_a_two_process_gang(tmp_path: Path) -> None:
    start_ranks(compute_on_two_ranks, (2, free_port(), str(tmp_path)), 2)

    results = [json.loads(Path(tmp_path, f"rank_{rank}.json").read_text()) for rank in range(2)]
    scores, labels, weights = (torch.cat(parts) for parts in zip(*(rank_data(rank) for rank in range(2))))
    assert results[0] == results[1], "every rank must compute the same values"
    values = results[0]
    assert set(values) == {"auc", "mean", "sum"}, "a metric updated on one rank only is left out"
    assert values["auc"] == pytest.approx(rank_sum_auc(scores.tolist(), labels.tolist()), abs=1e-6)
    assert values["mean"] == pytest.approx(float((scores * weights).sum() / weights.sum()), rel=1e-6)
    assert values["sum"] == pytest.approx(float(scores.sum()), rel=1e-6)


# Click prediction over two ranks, real gloo ---------------------------------------------------

CLICK_SEED = 5


def click_metrics_on_two_ranks(
    rank: int, world_size: int, port: int, out_dir: str, shard_sizes: tuple[int, int]
) -> None:
    with gloo_gang(rank, world_size, port) as gang:
        bag = MetricBag(gang)
        for name, (factory, _, _) in CLICK_METRICS.items():
            bag.register(name, factory())
        start = sum(shard_sizes[:rank])
        logits, probabilities, targets = (
            t[start : start + shard_sizes[rank]] for t in click_data(sum(shard_sizes), CLICK_SEED)
        )
        shard = (logits, probabilities, targets)
        for name in CLICK_METRICS:
            update_in_batches(name, bag[name], shard, batch_size=8)  # An empty shard: one empty batch.
        Path(out_dir, f"rank_{rank}.json").write_text(json.dumps(bag.compute()))


@pytest.mark.parametrize("shard_sizes", [(37, 13), (50, 0)], ids=["uneven_shards", "rank_1_empty"])
def test_click_metrics_over_a_two_process_gang_equal_numpy_over_all_rows(
    tmp_path: Path, shard_sizes: tuple[int, int]
) -> None:
    start_ranks(click_metrics_on_two_ranks, (2, free_port(), str(tmp_path), shard_sizes), 2)

    results = [json.loads(Path(tmp_path, f"rank_{rank}.json").read_text()) for rank in range(2)]
    assert results[0] == results[1], "every rank must compute the same values"
    data = click_data(sum(shard_sizes), CLICK_SEED)
    assert set(results[0]) == set(CLICK_METRICS)
    for name, value in results[0].items():
        expected = numpy_value(name, *data)
        assert value == pytest.approx(expected, rel=0, abs=CLICK_TOLERANCE.get(name, 1e-9)), name
