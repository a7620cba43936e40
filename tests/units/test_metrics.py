"""The metrics against hand and NumPy computations, and their reduction over a real 2-process gloo gang."""

from __future__ import annotations

import io
import json
import math
import warnings
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import numpy.typing as npt
import pytest
import torch
from torch.multiprocessing.spawn import spawn
from torchmetrics import Metric

import units.metrics
from gang import FakeGang
from gloo_jobs import free_port, gloo_gang
from units import (
    BinaryAUC,
    BinaryAveragePrecision,
    Calibration,
    LogLoss,
    Mean,
    MetricBag,
    NormalizedEntropy,
    PositiveRate,
    Sum,
    Throughput,
)


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


# Click prediction: references in NumPy ---------------------------------------------------------

Array = npt.NDArray[np.float64]


def np_log_loss(logits: Array, targets: Array) -> float:
    # log(1 + e^x) - x y, written so that no exp overflows.
    return float(np.mean(np.maximum(logits, 0) - logits * targets + np.log1p(np.exp(-np.abs(logits)))))


def np_normalized_entropy(logits: Array, targets: Array) -> float:
    """The log loss over that of predicting the base rate, clamped as TorchRec clamps it (only the log's argument)."""
    base_rate = float(targets.mean())
    eps = units.metrics.NE_BASE_RATE_EPS
    predicted = min(max(base_rate, eps), 1 - eps)
    base_log_loss = -(base_rate * math.log(predicted) + (1 - base_rate) * math.log1p(-predicted))
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


def test_numpy_average_precision_of_known_cases() -> None:
    # Thresholds 0.9 (P 1, R 1/2), 0.8 (P 1/2, R 1/2), 0.7 (P 2/3, R 1): 1/2 * 1 + 1/2 * 2/3.
    assert np_average_precision(np.array([0.9, 0.8, 0.7, 0.6]), np.array([1.0, 0.0, 1.0, 0.0])) == pytest.approx(5 / 6)
    # The tie at 0.5 is one threshold (P 2/3, R 1), not two orders of its rows.
    assert np_average_precision(np.array([0.9, 0.5, 0.5, 0.1]), np.array([1.0, 0.0, 1.0, 0.0])) == pytest.approx(5 / 6)
    assert np_average_precision(np.array([0.9, 0.5, 0.5, 0.1]), np.array([1.0, 1.0, 0.0, 0.0])) == pytest.approx(5 / 6)


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


def empty_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.empty(0), torch.empty(0), torch.empty(0)


@pytest.mark.parametrize("name", CLICK_METRICS)
def test_click_metric_over_batches_equals_numpy_over_all_rows(name: str) -> None:
    data = click_data(200, seed=1)
    metric = CLICK_METRICS[name][0]()

    update_in_batches(name, metric, data, batch_size=32)

    expected = numpy_value(name, *data)
    assert 0.0 < expected < 5.0, "the data must give the metric a value worth checking"
    assert float(metric.compute()) == pytest.approx(expected, rel=0, abs=CLICK_TOLERANCE.get(name, 1e-9))


@pytest.mark.parametrize("name", CLICK_METRICS)
def test_an_empty_batch_leaves_a_click_metric_unchanged(name: str) -> None:
    data = click_data(40, seed=2)
    before, after = CLICK_METRICS[name][0](), CLICK_METRICS[name][0]()
    update = CLICK_METRICS[name][1]

    update(before, *data)
    update(after, *empty_batch())
    update(after, *data)
    update(after, *empty_batch())

    assert float(after.compute()) == float(before.compute())


@pytest.mark.parametrize(
    ("name", "expected"),
    [("log_loss", math.nan), ("ne", math.nan), ("calibration", 0.0), ("pr_auc", math.nan), ("positive_rate", math.nan)],
)
def test_a_click_metric_that_saw_only_empty_batches_has_its_documented_value(name: str, expected: float) -> None:
    metric = CLICK_METRICS[name][0]()

    CLICK_METRICS[name][1](metric, *empty_batch())

    assert float(metric.compute()) == pytest.approx(expected, nan_ok=True)


def test_log_loss_of_confident_predictions_is_their_true_cost_not_an_infinity() -> None:
    # sigmoid(+-200) rounds to exactly 1 and 0 even in float64; from logits, the loss is still 200 and ~0.
    log_loss = LogLoss()

    log_loss.update(torch.tensor([200.0, -200.0, 200.0]), torch.tensor([0.0, 0.0, 1.0]))

    assert float(log_loss.compute()) == pytest.approx(200 / 3, rel=1e-12)


def test_normalized_entropy_of_always_predicting_the_base_rate_is_one() -> None:
    targets = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    ne = NormalizedEntropy()

    ne.update(torch.full((8,), math.log(0.25 / 0.75)), targets)

    assert float(ne.compute()) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("target", [0.0, 1.0], ids=["no_positives", "no_negatives"])
def test_normalized_entropy_of_a_single_class_is_finite_through_torchrecs_clamp(target: float) -> None:
    logits = torch.tensor([-3.0, -1.0, 0.5, 2.0])
    targets = torch.full((4,), target)
    ne = NormalizedEntropy()

    ne.update(logits, targets)

    value = float(ne.compute())
    as_numpy = logits.double().numpy(), targets.double().numpy()
    assert value == pytest.approx(np_normalized_entropy(*as_numpy), rel=1e-9)
    assert math.isfinite(value)
    assert value == pytest.approx(np_log_loss(*as_numpy) / units.metrics.NE_BASE_RATE_EPS, rel=1e-3)


def test_calibration_without_positives_is_zero_not_nan() -> None:
    calibration = Calibration()

    calibration.update(torch.tensor([-2.0, 1.0]), torch.tensor([0.0, 0.0]))

    assert float(calibration.compute()) == 0.0


def test_calibration_of_predicting_as_many_clicks_as_there_were_is_one() -> None:
    calibration = Calibration()

    calibration.update(torch.zeros(4), torch.tensor([1.0, 0.0, 0.0, 1.0]))  # 4 x 0.5 predicted, 2 clicked.

    assert float(calibration.compute()) == pytest.approx(1.0, abs=1e-12)


def test_average_precision_without_positives_is_zero_and_warns_nothing() -> None:
    average_precision = BinaryAveragePrecision()
    average_precision.update(torch.tensor([0.2, 0.9]), torch.tensor([0, 0]))

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        value = float(average_precision.compute())

    assert value == 0.0 and math.copysign(1.0, value) == 1.0


def test_logits_of_shape_n_by_1_meet_targets_of_shape_n_and_other_sizes_are_refused() -> None:
    log_loss = LogLoss()

    log_loss.update(torch.zeros(3, 1), torch.tensor([1.0, 0.0, 1.0]))

    assert float(log_loss.compute()) == pytest.approx(math.log(2), rel=1e-12)
    with pytest.raises(ValueError, match="must have as many elements, but have 3 and 2"):
        log_loss.update(torch.zeros(3), torch.zeros(2))


def make_click_bag() -> MetricBag:
    bag = MetricBag(FakeGang())
    for name, (factory, _, _) in CLICK_METRICS.items():
        bag.register(name, factory())
    return bag


def update_click_bag(bag: MetricBag, data: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
    for name in CLICK_METRICS:
        update_in_batches(name, bag[name], data, batch_size=16)


def test_click_metrics_round_trip_through_the_metric_bag_state_dict_and_continue_exactly() -> None:
    uninterrupted, saved = make_click_bag(), make_click_bag()
    update_click_bag(uninterrupted, click_data(50, seed=3))
    update_click_bag(saved, click_data(50, seed=3))
    buffer = io.BytesIO()
    torch.save(saved.state_dict(), buffer)  # As a checkpoint takes it, and loads it with weights_only.
    buffer.seek(0)
    restored = make_click_bag()

    restored.load_state_dict(torch.load(buffer, weights_only=True))

    assert restored.compute() == uninterrupted.compute()
    update_click_bag(uninterrupted, click_data(30, seed=4))
    update_click_bag(restored, click_data(30, seed=4))
    assert restored.compute() == uninterrupted.compute()


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


@pytest.mark.slow
@pytest.mark.parametrize("shard_sizes", [(37, 13), (50, 0)], ids=["uneven_shards", "rank_1_empty"])
def test_click_metrics_over_a_two_process_gang_equal_numpy_over_all_rows(
    tmp_path: Path, shard_sizes: tuple[int, int]
) -> None:
    spawn(click_metrics_on_two_ranks, args=(2, free_port(), str(tmp_path), shard_sizes), nprocs=2, join=True)

    results = [json.loads(Path(tmp_path, f"rank_{rank}.json").read_text()) for rank in range(2)]
    assert results[0] == results[1], "every rank must compute the same values"
    data = click_data(sum(shard_sizes), CLICK_SEED)
    assert set(results[0]) == set(CLICK_METRICS)
    for name, value in results[0].items():
        expected = numpy_value(name, *data)
        assert value == pytest.approx(expected, rel=0, abs=CLICK_TOLERANCE.get(name, 1e-9)), name
