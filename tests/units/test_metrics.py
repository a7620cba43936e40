"""The metrics against hand computations, and their reduction over a real 2-process gloo gang."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch.multiprocessing.spawn import spawn

import units.metrics
from gang import FakeGang, ProcessGroupGang
from units import BinaryAUC, Mean, MetricBag, Sum, Throughput


def rank_sum_auc(scores: list[float], labels: list[int]) -> float:
    """The Mann-Whitney AUC: (rank sum of the positives - n_pos(n_pos+1)/2) / (n_pos n_neg), ties averaged."""
    order = sorted(range(len(scores)), key=lambda i: scores[i])
    ranks = [0.0] * len(scores)
    start = 0
    while start < len(order):
        stop = start
        while stop + 1 < len(order) and scores[order[stop + 1]] == scores[order[start]]:
            stop += 1
        for i in order[start : stop + 1]:
            ranks[i] = (start + stop) / 2 + 1  # The mean of the 1-based ranks start+1 .. stop+1.
        start = stop + 1
    num_pos = sum(labels)
    num_neg = len(labels) - num_pos
    pos_rank_sum = sum(r for r, y in zip(ranks, labels) if y == 1)
    return (pos_rank_sum - num_pos * (num_pos + 1) / 2) / (num_pos * num_neg)


def test_rank_sum_auc_of_a_known_case() -> None:
    # Positives at 0.8, 0.4; negatives at 0.6, 0.4 (a tie), 0.1: 2x3 pairs, won 1+1+1 + 0+0.5+1 = 4.5.
    assert rank_sum_auc([0.8, 0.4, 0.6, 0.4, 0.1], [1, 1, 0, 0, 0]) == pytest.approx(4.5 / 6)


def test_mean_is_weighted_by_the_weights() -> None:
    mean = Mean()

    mean.update(torch.tensor(2.0), weight=3)
    mean.update(torch.tensor([4.0, 10.0]), weight=torch.tensor([1.0, 0.0]))

    assert float(mean.compute()) == pytest.approx((2 * 3 + 4 * 1) / 4)


def test_sum_adds_everything() -> None:
    total = Sum()

    total.update(torch.tensor([1.0, 2.5]))
    total.update(3)

    assert float(total.compute()) == pytest.approx(6.5)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now


def test_throughput_is_units_per_second_since_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(units.metrics, "time", SimpleNamespace(perf_counter=clock.perf_counter))
    throughput = Throughput()

    clock.now += 2.0
    throughput.update(100)
    clock.now += 2.0
    throughput.update(300)

    assert float(throughput.compute()) == pytest.approx(400 / 4.0)

    clock.now += 50.0  # Time before the reset does not count.
    throughput.reset()
    clock.now += 1.0
    throughput.update(10)

    assert float(throughput.compute()) == pytest.approx(10 / 1.0)


@pytest.mark.filterwarnings("ignore:The ``compute`` method of metric Throughput was called before")
def test_throughput_without_elapsed_time_is_zero() -> None:
    assert float(Throughput().compute()) == 0.0


def test_binary_auc_matches_the_rank_sum_formula() -> None:
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 2, (200,), generator=generator)
    # Rounded scores so that ties occur, and a signal so the AUC is not 0.5.
    scores = torch.round((torch.rand(200, generator=generator) + 0.3 * labels) * 20) / 20
    auc = BinaryAUC()

    auc.update(scores[:70], labels[:70])
    auc.update(scores[70:], labels[70:])

    expected = rank_sum_auc(scores.tolist(), labels.tolist())
    assert 0.6 < expected < 0.95
    assert float(auc.compute()) == pytest.approx(expected, abs=1e-6)


# Two ranks, real gloo --------------------------------------------------------------------------

RANK_SIZES = (3, 8)  # Uneven on purpose: AUC gathers lists of different lengths.


def rank_data(rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(10 + rank)
    size = RANK_SIZES[rank]
    scores = torch.rand(size, generator=generator)
    labels = torch.tensor([(i + rank) % 2 for i in range(size)])
    weights = torch.arange(1.0, size + 1)
    return scores, labels, weights


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def compute_on_two_ranks(rank: int, world_size: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        assert dist.group.WORLD is not None
        bag = MetricBag(ProcessGroupGang(dist.group.WORLD, torch.device("cpu")))
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
    finally:
        dist.barrier()  # No rank tears down gloo while a peer still talks to it.
        dist.destroy_process_group()


@pytest.mark.slow
def test_metrics_reduce_over_a_two_process_gang(tmp_path: Path) -> None:
    spawn(compute_on_two_ranks, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)

    results = [json.loads(Path(tmp_path, f"rank_{rank}.json").read_text()) for rank in range(2)]
    scores, labels, weights = (torch.cat(parts) for parts in zip(*(rank_data(rank) for rank in range(2))))
    assert results[0] == results[1], "every rank must compute the same values"
    values = results[0]
    assert set(values) == {"auc", "mean", "sum"}, "a metric updated on one rank only is left out"
    assert values["auc"] == pytest.approx(rank_sum_auc(scores.tolist(), labels.tolist()), abs=1e-6)
    assert values["mean"] == pytest.approx(float((scores * weights).sum() / weights.sum()), rel=1e-6)
    assert values["sum"] == pytest.approx(float(scores.sum()), rel=1e-6)


def test_the_same_bag_on_a_fake_gang_computes_the_local_values() -> None:
    bag = MetricBag(FakeGang())
    bag.register("auc", BinaryAUC())
    scores, labels, _ = rank_data(1)

    bag["auc"].update(scores, labels)

    assert bag.compute()["auc"] == pytest.approx(rank_sum_auc(scores.tolist(), labels.tolist()), abs=1e-6)
