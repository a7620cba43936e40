"""GAUC and the per-slice NE and calibration against independent references: torchmetrics' AUROC and the
plain metrics over each group's or slice's rows, and a brute-force pairwise count."""

from __future__ import annotations

import math

import pytest
import torch
from torchmetrics.functional.classification import binary_auroc

from gang import FakeGang
from units import (
    Calibration,
    GroupedAUC,
    MetricBag,
    NormalizedEntropy,
    SlicedCalibration,
    SlicedNormalizedEntropy,
    TooManySlicesError,
)
from units.grouped_metrics import per_group_auc, slice_label


def grouped_data(num_rows: int, num_groups: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Scores rounded to tenths (many ties), labels, and group ids far apart (as hashed ids are)."""
    generator = torch.Generator().manual_seed(seed)
    scores = torch.round(torch.rand(num_rows, generator=generator) * 10) / 10
    labels = (torch.rand(num_rows, generator=generator) < 0.3 + 0.4 * scores).to(torch.float32)
    groups = torch.randint(0, num_groups, (num_rows,), generator=generator) * 7919 - 5000
    return scores, labels, groups


def reference_gauc(scores: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor) -> tuple[float, int]:
    """A loop over groups, each one's AUC by torchmetrics, weighted by its rows; one-class groups left out."""
    total, weight, counted = 0.0, 0, 0
    for group in groups.unique():
        rows = groups == group
        group_labels = labels[rows]
        if group_labels.min() == group_labels.max():
            continue
        total += float(binary_auroc(scores[rows], group_labels.long())) * int(rows.sum())
        weight += int(rows.sum())
        counted += 1
    return total / weight, counted


def pairwise_auc(scores: list[float], labels: list[int]) -> float:
    """The share of (positive, negative) pairs ranked right, a tie counting one half."""
    pairs = [(p, n) for p, yp in zip(scores, labels) if yp for n, yn in zip(scores, labels) if not yn]
    return sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in pairs) / len(pairs)


def test_per_group_auc_matches_a_pairwise_count_with_ties() -> None:
    scores = torch.tensor([0.9, 0.1, 0.5, 0.5, 0.2, 0.7, 0.3, 0.3, 0.8], dtype=torch.float64)
    labels = torch.tensor([1, 0, 1, 0, 0, 1, 1, 0, 1], dtype=torch.float64)
    groups = torch.tensor([2, 2, 2, 2, 1, 1, 1, 1, 3])

    auc, counts, counted = per_group_auc(scores, labels, groups)

    assert counts.tolist() == [4, 4, 1]
    assert counted.tolist() == [True, True, False], "the group of one row has one class"
    assert auc[0] == pytest.approx(pairwise_auc([0.2, 0.7, 0.3, 0.3], [0, 1, 1, 0]))
    assert auc[1] == pytest.approx(pairwise_auc([0.9, 0.1, 0.5, 0.5], [1, 0, 1, 0]))
    assert float(auc[1]) == pytest.approx(0.875), "a tie between a positive and a negative counts one half"


def test_gauc_equals_torchmetrics_auc_per_group_weighted_by_rows() -> None:
    scores, labels, groups = grouped_data(2000, 150, seed=3)
    metric = GroupedAUC()
    for start in range(0, len(scores), 128):  # In batches, an empty one among them.
        metric.update(scores[start : start + 128], labels[start : start + 128], groups[start : start + 128])
    metric.update(scores[:0], labels[:0], groups[:0])

    values = metric.compute()

    expected, counted = reference_gauc(scores, labels, groups)
    assert values[""].item() == pytest.approx(expected, abs=1e-9)
    assert values["_groups"].item() == counted
    assert counted < 150, "the data must hold groups of one class, which are left out"


def test_gauc_is_nan_without_a_group_of_both_classes() -> None:
    metric = GroupedAUC()
    metric.update(torch.tensor([0.2, 0.7]), torch.tensor([1.0, 0.0]), torch.tensor([1, 2]))

    values = metric.compute()

    assert math.isnan(values[""].item()) and values["_groups"].item() == 0


def test_gauc_refuses_arguments_of_different_lengths() -> None:
    with pytest.raises(ValueError, match="as many elements"):
        GroupedAUC().update(torch.rand(3), torch.ones(3), torch.arange(2))


def test_sliced_ne_and_calibration_equal_the_plain_metrics_over_each_slice() -> None:
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(300, generator=generator)
    labels = (torch.rand(300, generator=generator) < torch.sigmoid(logits)).to(torch.float32)
    slices = torch.randint(0, 4, (300,), generator=generator) * 10
    ne, calibration = SlicedNormalizedEntropy("device"), SlicedCalibration("device", names={10: "phone"})
    for start in range(0, 300, 64):
        for metric in (ne, calibration):
            metric.update(logits[start : start + 64], labels[start : start + 64], slices[start : start + 64])

    ne_values, calibration_values = ne.compute(), calibration.compute()

    assert set(ne_values) == {"0", "10", "20", "30"}
    assert set(calibration_values) == {"0", "phone", "20", "30"}, "a named slice takes its name"
    for value, name in ((0, "0"), (10, "phone"), (20, "20"), (30, "30")):
        rows = slices == value
        reference_ne, reference_calibration = NormalizedEntropy(), Calibration()
        reference_ne.update(logits[rows], labels[rows])
        reference_calibration.update(logits[rows], labels[rows])
        assert ne_values[str(value)].item() == pytest.approx(reference_ne.compute().item(), rel=1e-12)
        assert calibration_values[name].item() == pytest.approx(reference_calibration.compute().item(), rel=1e-12)


def test_a_slice_column_of_too_many_values_is_refused_in_one_line() -> None:
    metric = SlicedNormalizedEntropy("userId", max_slices=5)
    metric.update(torch.zeros(5), torch.ones(5), torch.arange(5))

    with pytest.raises(TooManySlicesError, match=r"at most 5 values, but 'userId' has 6 or more") as error:
        metric.update(torch.zeros(1), torch.ones(1), torch.tensor([99]))
    assert "\n" not in str(error.value)


def test_slice_labels_are_safe_as_tags_and_keys() -> None:
    assert slice_label("13") == "13"
    assert slice_label("mobile phone/en") == "mobile_phone_en"
    assert slice_label("") == "_"


def test_a_metric_bag_names_the_values_by_suffix_and_resumes_them() -> None:
    scores, labels, groups = grouped_data(400, 30, seed=4)
    logits = torch.logit(scores.clamp(0.05, 0.95))

    def bag_of(updates: slice) -> MetricBag:
        bag = MetricBag(FakeGang())
        bag.register("gauc", GroupedAUC())
        bag.register("ne/", SlicedNormalizedEntropy("hour", names={1: "one"}))
        bag["gauc"].update(scores[updates], labels[updates], groups[updates])
        bag["ne/"].update(logits[updates], labels[updates], groups[updates] % 2)
        return bag

    whole = bag_of(slice(None)).compute()
    first_half = bag_of(slice(0, 200))
    resumed = MetricBag(FakeGang())
    resumed.register("gauc", GroupedAUC())
    resumed.register("ne/", SlicedNormalizedEntropy("hour", names={1: "one"}))
    resumed.load_state_dict(first_half.state_dict())
    resumed["gauc"].update(scores[200:], labels[200:], groups[200:])
    resumed["ne/"].update(logits[200:], labels[200:], groups[200:] % 2)

    assert set(whole) == {"gauc", "gauc_groups", "ne/0", "ne/one"}
    assert resumed.compute() == pytest.approx(whole, rel=1e-12)
