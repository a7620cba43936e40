"""GAUC and the per-slice metrics over a real 2-process gloo gang equal one process's over the same rows: a
group's rows spread over both ranks count as one group."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gang import FakeGang, Gang
from support.gloo_jobs import free_port, gloo_gang, start_ranks
from units import GroupedAUC, MetricBag, SlicedCalibration, SlicedNormalizedEntropy

NUM_ROWS = 600


def rows() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tied scores, their logits, labels, and groups of about 15 rows (the slice is the group's parity).

    In float64, as the metrics sum: once, under load, the ranks' NE and calibration differed from this process's by
    8e-7 (relative), a float32 rounding of these inputs that one of the processes computed otherwise."""
    generator = torch.Generator().manual_seed(11)
    scores = torch.round(torch.rand(NUM_ROWS, generator=generator, dtype=torch.float64) * 20) / 20
    labels = (torch.rand(NUM_ROWS, generator=generator, dtype=torch.float64) < 0.2 + 0.6 * scores).to(torch.float64)
    groups = torch.randint(0, 40, (NUM_ROWS,), generator=generator)
    return scores, torch.logit(scores.clamp(0.01, 0.99)), labels, groups


def metric_values(gang: Gang, shard: torch.Tensor) -> dict[str, float]:
    bag = MetricBag(gang)
    bag.register("gauc", GroupedAUC())
    bag.register("ne/", SlicedNormalizedEntropy("parity"))
    bag.register("calibration/", SlicedCalibration("parity"))
    scores, logits, labels, groups = (t[shard] for t in rows())
    for start in range(0, max(len(shard), 1), 50):  # An empty shard: one empty batch.
        batch = slice(start, start + 50)
        bag["gauc"].update(scores[batch], labels[batch], groups[batch])
        for name in ("ne/", "calibration/"):
            bag[name].update(logits[batch], labels[batch], groups[batch] % 2)
    return bag.compute()


def on_two_ranks(rank: int, world_size: int, port: int, out_dir: str, rank_1_rows: int) -> None:
    with gloo_gang(rank, world_size, port) as gang:
        # Rank 1 takes every other row of the first 2 * rank_1_rows, so that each group lies on both ranks.
        index = torch.arange(NUM_ROWS)
        on_rank_1 = (index % 2 == 1) & (index < 2 * rank_1_rows)
        shard = index[on_rank_1] if rank == 1 else index[~on_rank_1]
        Path(out_dir, f"rank_{rank}.json").write_text(json.dumps(metric_values(gang, shard)))


@pytest.mark.parametrize("rank_1_rows", [NUM_ROWS // 2, 0], ids=["interleaved", "rank_1_empty"])
def test_grouped_metrics_over_two_ranks_equal_one_process(tmp_path: Path, rank_1_rows: int) -> None:
    start_ranks(on_two_ranks, (2, free_port(), str(tmp_path), rank_1_rows), 2)

    results = [json.loads(Path(tmp_path, f"rank_{rank}.json").read_text()) for rank in range(2)]
    one_process = metric_values(FakeGang(), torch.arange(NUM_ROWS))
    assert results[0] == results[1], "every rank must compute the same values"
    assert set(results[0]) == {"gauc", "gauc_groups", "ne/0", "ne/1", "calibration/0", "calibration/1"}
    assert results[0] == pytest.approx(one_process, rel=1e-12)
    assert results[0]["gauc_groups"] == 40, "a group split over the ranks counts once"
