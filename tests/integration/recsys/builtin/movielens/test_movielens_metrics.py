"""The ``movielens_small`` preset's user GAUC and per-slice metrics as a user sees them, and their misuse stopping
in one line with exit 2."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pyarrow.csv as pa_csv
import pytest
import torch
from torchmetrics.functional.classification import binary_auroc

from recsys.tabular.hashing import hash_value
from recsys.tabular.schema import resolve_path
from support.cli_runs import assert_one_line_error, printed_by_main, run_main
from support.resume_helpers import check_ok, metric_history, run_recipes

VALID_FROM = 1339227125  # The preset's `dataset.split.valid_from`.
# 10 steps, shuffled in windows of 10,240 rows rather than the whole training set: the metrics, not the learning.
SHORT = [
    "trainer.max_num_steps=10",
    "trainer.validate_every_n_steps=10",
    "dataset.shuffle_buffer_size=10240",
    "metrics.recorders.console=false",
]


def valid_user_ids() -> list[int]:
    """The bucket of the user of each validation row, in file order: the groups the preset's GAUC counts."""
    path = resolve_path("package://recsys.builtin.movielens/ml-latest-small/ratings.csv")
    with open(path, newline="") as file:
        return [
            hash_value(r["userId"], "userId", 50000) for r in csv.DictReader(file) if int(r["timestamp"]) >= VALID_FROM
        ]


def reference_gauc(scores: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor) -> float:
    total, weight = 0.0, 0
    for group in groups.unique():
        rows = groups == group
        if labels[rows].min() != labels[rows].max():
            total += float(binary_auroc(scores[rows], labels[rows].long())) * int(rows.sum())
            weight += int(rows.sum())
    return total / weight


def test_the_preset_reports_user_gauc_equal_to_a_reference_over_its_predictions_and_ne_per_hour(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    check_ok(run_recipes(tmp_path, "train", "movielens_small", "-o", "out", *SHORT, "metrics.slice_by=hour"))
    monkeypatch.chdir(tmp_path)
    printed_by_main(capsys, "predict", "out", "--split", "valid", "-o", "valid.csv")

    valid = metric_history(tmp_path / "out")["valid"][-1]
    hours = {key.removeprefix("ne/") for key in valid if key.startswith("ne/")}
    assert hours and hours <= {str(h) for h in range(24)} | {f"{a}_{b}" for a in range(24) for b in range(24)}
    assert {f"calibration/{hour}" for hour in hours} <= set(valid)
    assert 0.5 < valid["gauc"] < 1.0 and valid["gauc_groups"] > 10
    predicted = pa_csv.read_csv(tmp_path / "valid.csv")
    scored = metric_history(tmp_path / "out")["eval_valid"][-1]  # The pass that wrote valid.csv.
    scores = torch.tensor(predicted.column("score").to_pylist(), dtype=torch.float64)
    labels = torch.tensor(predicted.column("label").to_pylist(), dtype=torch.float64)
    assert scored["gauc"] == pytest.approx(reference_gauc(scores, labels, torch.tensor(valid_user_ids())), abs=1e-6)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("metrics.group_by=nope", r"`metrics.group_by` must name a single-valued categorical column .*userId.*'nope'"),
        ("metrics.slice_by=userid", r"`metrics.slice_by` .* but is 'userid' instead. Did you mean 'userId'\?"),
        ("metrics.slice_by=movieId", r"`metrics.slice_by` must name a column of at most 1000 values, but 'movieId'"),
    ],
    ids=["group_by_not_in_the_schema", "slice_by_misspelt", "slice_by_of_too_many_values"],
)
def test_a_metrics_column_misuse_stops_in_one_line_with_exit_2(
    tmp_path: Path, override: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_main(capsys, "train", "movielens_small", "-o", str(tmp_path / "out"), *SHORT, override)

    assert code == 2
    assert_one_line_error(err)
    assert re.search(message, err), err
    assert not (tmp_path / "out" / "checkpoints").exists()
