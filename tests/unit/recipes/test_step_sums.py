"""The step's agreement as values summed in the gradients' float32: exact for any realistic count of targets."""

from __future__ import annotations

import math

import torch

from recipes.training.step_sums import local_step_stats, read_step_stats, step_stats


def test_the_targets_of_many_ranks_sum_exactly_in_float32_and_a_non_finite_loss_or_a_stop_is_seen() -> None:
    ranks = [
        step_stats(torch.tensor(0.5, dtype=torch.float64), False, 50_000_001),
        step_stats(torch.tensor(math.inf, dtype=torch.float64), True, 16_777_217),  # 2**24 + 1: not a float32
        step_stats(torch.tensor(0.25, dtype=torch.float64), False, 7),
    ]

    summed = torch.stack([values.to(torch.float32) for values in ranks]).sum(dim=0)

    assert read_step_stats(summed.double().tolist()) == (False, True, 50_000_001 + 16_777_217 + 7)
    assert read_step_stats(ranks[0].tolist()) == (True, False, 50_000_001)


def test_a_single_process_reads_the_values_a_gang_of_one_would_sum_without_a_tensor() -> None:
    for loss_sum in (0.5, math.inf, -math.inf, math.nan):
        for stop_requested in (False, True):
            for num_targets in (0, 256, 4096 * 3 + 7):
                stats = step_stats(torch.tensor(loss_sum, dtype=torch.float64), stop_requested, num_targets)
                assert local_step_stats(loss_sum, stop_requested, num_targets) == stats.tolist()
