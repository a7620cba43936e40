"""The click metrics' references, computed by hand and with NumPy, and the data the metric tests compare them on."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import torch
from torchmetrics import Metric

from units import BinaryAveragePrecision, Calibration, LogLoss, NormalizedEntropy, PositiveRate


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


RANK_SIZES = (3, 8)  # Uneven on purpose: AUC gathers lists of different lengths.


def rank_data(rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(10 + rank)
    size = RANK_SIZES[rank]
    scores = torch.rand(size, generator=generator)
    labels = torch.tensor([(i + rank) % 2 for i in range(size)])
    weights = torch.arange(1.0, size + 1)
    return scores, labels, weights


Array = npt.NDArray[np.float64]


def np_log_loss(logits: Array, targets: Array) -> float:
    # log(1 + e^x) - x y, written so that no exp overflows.
    return float(np.mean(np.maximum(logits, 0) - logits * targets + np.log1p(np.exp(-np.abs(logits)))))


def np_normalized_entropy(logits: Array, targets: Array) -> float:
    """The log loss over that of predicting the base rate; NaN for rows of one class, whose base rate's is 0."""
    base_rate = float(targets.mean())
    if base_rate in (0.0, 1.0):
        return math.nan
    base_log_loss = -(base_rate * math.log(base_rate) + (1 - base_rate) * math.log1p(-base_rate))
    return np_log_loss(logits, targets) / base_log_loss


def np_calibration(logits: Array, targets: Array) -> float:
    return float(np.sum(1 / (1 + np.exp(-logits))) / np.sum(targets))


def np_average_precision(scores: Array, labels: Array) -> float:
    """sum_n (R_n - R_{n-1}) P_n over the distinct scores, from the highest down (tied scores are one threshold)."""
    order = np.argsort(-scores, kind="stable")
    sorted_scores, sorted_labels = scores[order], labels[order]
    last_of_each_score = np.r_[np.flatnonzero(np.diff(sorted_scores)), len(sorted_scores) - 1]
    true_positives = np.cumsum(sorted_labels)[last_of_each_score]
    predicted_positives = last_of_each_score + 1
    precision = true_positives / predicted_positives
    recall = true_positives / true_positives[-1]
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def click_data(num_rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logits (float32, as a model gives them, with ties), their probabilities, and 0/1 targets drawn from them.

    The probabilities are computed once over all rows, so that a shard of them is bit-for-bit the
    same rows of the whole (a tie that one ulp would break decides PR-AUC).
    """
    rng = np.random.default_rng(seed)
    logits = np.round(rng.normal(-1.0, 1.5, num_rows) * 4) / 4
    targets = (rng.random(num_rows) < 1 / (1 + np.exp(-logits))).astype(np.float32)
    logits_tensor = torch.from_numpy(logits.astype(np.float32))
    return logits_tensor, torch.sigmoid(logits_tensor), torch.from_numpy(targets)


UpdateFn = Callable[[Metric, torch.Tensor, torch.Tensor, torch.Tensor], None]
ReferenceFn = Callable[[Array, Array, Array], float]
# name -> (the metric, how a batch of (logits, probabilities, targets) updates it, its NumPy value over all rows)
CLICK_METRICS: dict[str, tuple[Callable[[], Metric], UpdateFn, ReferenceFn]] = {
    "log_loss": (LogLoss, lambda m, x, p, y: m.update(x, y), lambda x, p, y: np_log_loss(x, y)),
    "ne": (NormalizedEntropy, lambda m, x, p, y: m.update(x, y), lambda x, p, y: np_normalized_entropy(x, y)),
    "calibration": (Calibration, lambda m, x, p, y: m.update(x, y), lambda x, p, y: np_calibration(x, y)),
    "pr_auc": (
        BinaryAveragePrecision,
        lambda m, x, p, y: m.update(p, y.long()),
        lambda x, p, y: np_average_precision(p, y),
    ),
    "positive_rate": (PositiveRate, lambda m, x, p, y: m.update(y), lambda x, p, y: float(np.mean(y))),
}
CLICK_TOLERANCE = {"pr_auc": 1e-6}  # The others: 1e-9.


def numpy_value(name: str, logits: torch.Tensor, probabilities: torch.Tensor, targets: torch.Tensor) -> float:
    as_float64 = (t.numpy().astype(np.float64) for t in (logits, probabilities, targets))
    return CLICK_METRICS[name][2](*as_float64)


def update_in_batches(
    name: str, metric: Metric, data: tuple[torch.Tensor, torch.Tensor, torch.Tensor], batch_size: int
) -> None:
    """Every batch of ``batch_size`` rows, then an empty one, as the last batch of a data-parallel rank may be."""
    update = CLICK_METRICS[name][1]
    num_rows = len(data[0])
    for start in [*range(0, num_rows, batch_size), num_rows]:
        update(metric, *(t[start : start + batch_size] for t in data))
