"""The metrics against hand and NumPy computations, on one process (a real gang's reduction:
``tests/integration/units/test_metrics.py``)."""

from __future__ import annotations

import io
import math
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import units.metrics
from gang import FakeGang
from support.metric_references import (
    CLICK_METRICS,
    CLICK_TOLERANCE,
    click_data,
    np_average_precision,
    numpy_value,
    rank_data,
    rank_sum_auc,
    update_in_batches,
)
from units import (
    BinaryAUC,
    BinaryAveragePrecision,
    Calibration,
    GroupedAUC,
    LogLoss,
    Mean,
    MetricBag,
    NormalizedEntropy,
    PositiveRate,
    SlicedCalibration,
    SlicedNormalizedEntropy,
    Sum,
    Throughput,
)
from units.metrics import WithoutBetterSide


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


# The bag's values on one rank ------------------------------------------------------------------


def test_the_same_bag_on_a_fake_gang_computes_the_local_values() -> None:
    bag = MetricBag(FakeGang())
    bag.register("auc", BinaryAUC())
    scores, labels, _ = rank_data(1)

    bag["auc"].update(scores, labels)

    assert bag.compute()["auc"] == pytest.approx(rank_sum_auc(scores.tolist(), labels.tolist()), abs=1e-6)


# Click prediction: the NumPy references themselves, then the metrics against them ----------------


def test_numpy_average_precision_of_known_cases() -> None:
    # Thresholds 0.9 (P 1, R 1/2), 0.8 (P 1/2, R 1/2), 0.7 (P 2/3, R 1): 1/2 * 1 + 1/2 * 2/3.
    assert np_average_precision(np.array([0.9, 0.8, 0.7, 0.6]), np.array([1.0, 0.0, 1.0, 0.0])) == pytest.approx(5 / 6)
    # The tie at 0.5 is one threshold (P 2/3, R 1), not two orders of its rows.
    assert np_average_precision(np.array([0.9, 0.5, 0.5, 0.1]), np.array([1.0, 0.0, 1.0, 0.0])) == pytest.approx(5 / 6)
    assert np_average_precision(np.array([0.9, 0.5, 0.5, 0.1]), np.array([1.0, 1.0, 0.0, 0.0])) == pytest.approx(5 / 6)


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
    [
        ("log_loss", math.nan),
        ("ne", math.nan),
        ("calibration", math.nan),
        ("pr_auc", math.nan),
        ("positive_rate", math.nan),
    ],
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
def test_metrics_undefined_on_one_class_are_nan_and_say_why(target: float) -> None:
    # Before: AUC 0.0 and NE about 1e12 times the log loss, which ranked checkpoints as numbers.
    logits = torch.tensor([-3.0, -1.0, 0.5, 2.0])
    targets = torch.full((4,), target)
    ne, auc = NormalizedEntropy(), BinaryAUC()
    ne.update(logits, targets)
    auc.update(torch.sigmoid(logits), targets.long())
    undefined: list[NormalizedEntropy | BinaryAUC | BinaryAveragePrecision] = [ne, auc]
    if target == 0.0:  # Average precision needs a positive; with only positives it is defined.
        average_precision = BinaryAveragePrecision()
        average_precision.update(torch.sigmoid(logits), targets.long())
        undefined.append(average_precision)

    for metric in undefined:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert math.isnan(float(metric.compute())), type(metric).__name__
        assert metric.undefined_because == f"the data holds only label {int(target)} (4 rows)"


def test_calibration_without_positives_is_nan() -> None:
    calibration = Calibration()

    calibration.update(torch.tensor([-2.0, 1.0]), torch.tensor([0.0, 0.0]))

    assert math.isnan(float(calibration.compute()))


def test_a_metric_defined_again_after_reset_says_no_reason() -> None:
    auc = BinaryAUC()
    auc.update(torch.tensor([0.2, 0.9]), torch.tensor([0, 0]))
    auc.compute()
    auc.reset()

    auc.update(torch.tensor([0.2, 0.9]), torch.tensor([0, 1]))

    assert float(auc.compute()) == 1.0
    assert auc.undefined_because is None


def test_metrics_say_which_way_is_better_and_which_have_no_better_side() -> None:
    assert [m.higher_is_better for m in (BinaryAUC(), BinaryAveragePrecision(), GroupedAUC())] == [True] * 3
    assert [m.higher_is_better for m in (LogLoss(), NormalizedEntropy(), SlicedNormalizedEntropy())] == [False] * 3
    assert Mean().higher_is_better is None
    for metric in (Calibration(), PositiveRate(), SlicedCalibration()):
        assert isinstance(metric, WithoutBetterSide)


def test_calibration_of_predicting_as_many_clicks_as_there_were_is_one() -> None:
    calibration = Calibration()

    calibration.update(torch.zeros(4), torch.tensor([1.0, 0.0, 0.0, 1.0]))  # 4 x 0.5 predicted, 2 clicked.

    assert float(calibration.compute()) == pytest.approx(1.0, abs=1e-12)


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
