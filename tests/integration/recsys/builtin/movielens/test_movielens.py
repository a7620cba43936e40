"""The ``movielens_small`` preset run as a user runs it: it trains, validates and predicts a test split cut by
time, and bad ratings or a split that leaves validation empty stop the run in one line."""

from __future__ import annotations

import csv
from pathlib import Path

import pyarrow.csv as pa_csv
import pytest

from recsys.tabular.schema import resolve_path
from support.cli_runs import assert_one_line_error, printed_by_main, run_main
from support.resume_helpers import check_ok, metric_history, run_recipes

NUM_RATINGS = 100_004


def shipped_file(name: str) -> str:
    return resolve_path(f"package://recsys.builtin.movielens/ml-latest-small/{name}")


def ratings() -> list[dict[str, str]]:
    with open(shipped_file("ratings.csv"), newline="") as file:
        return list(csv.DictReader(file))


@pytest.mark.parametrize("rating", ["nan", "inf", "4.x"])
def test_a_bad_rating_ends_training_in_one_line_with_exit_2(
    tmp_path: Path, rating: str, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = Path(shipped_file("ratings.csv")).read_text().splitlines()[:200]
    user, movie, _, timestamp = lines[3].split(",")
    lines[3] = ",".join([user, movie, rating, timestamp])
    ratings_path = tmp_path / "ratings.csv"
    ratings_path.write_text("\n".join(lines) + "\n")
    paths = [f"dataset.train_path={ratings_path}", f"dataset.valid_path={ratings_path}"]
    # The preset's cut (2012) is later than these lines: a cut among them, so that the split leaves rows to validate.
    cut = f"dataset.split.valid_from={sorted(int(line.rsplit(',', 1)[1]) for line in lines[1:])[100]}"

    code, _, err = run_main(
        capsys, "train", "movielens_small", "-o", str(tmp_path / "out"), *paths, cut, "dataset.max_malformed_rows=0"
    )

    assert code == 2
    assert_one_line_error(err, "Line 4 of ", "ratings.csv", rating)
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_the_preset_trains_validates_and_predicts_a_test_split_cut_by_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    times = sorted(int(r["timestamp"]) for r in ratings())
    test_from = times[NUM_RATINGS * 9 // 10]  # The latest tenth tests; the tenth before it validates.
    ratings_path = "package://recsys.builtin.movielens/ml-latest-small/ratings.csv"
    cut = [f"dataset.test_path={ratings_path}", f"dataset.split.test_from={test_from}"]
    short = ["trainer.max_num_steps=20", "trainer.validate_every_n_steps=10", "metrics.recorders.console=false"]

    check_ok(run_recipes(tmp_path, "train", "movielens_small", "-o", "out", *cut, *short, timeout=600))
    monkeypatch.chdir(tmp_path)
    predicted = printed_by_main(capsys, "predict", "out", "--split", "test", "-o", "test.csv")

    valid = metric_history(tmp_path / "out")["valid"]
    assert [entry["step"] for entry in valid] == [10, 20] and valid[-1]["auc"] > 0.6
    assert "test: auc=" in predicted
    assert pa_csv.read_csv(tmp_path / "test.csv").num_rows == sum(time >= test_from for time in times)


def test_a_split_that_leaves_validation_empty_stops_in_one_line_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Milliseconds for seconds: no rating is as late as this, so validation would score nothing (found in the pass
    # over every file that the genre history makes at start-up).
    short = ["dataset.split.valid_from=1339227125000", "trainer.max_num_steps=4", "trainer.validate_every_n_steps=2"]

    code, _, err = run_main(capsys, "train", "movielens_small", "-o", str(tmp_path / "out"), *short)

    assert code == 2
    assert_one_line_error(err, "`dataset.split.valid_from` must leave rows to validate, but is 1339227125000 while")
    assert not (tmp_path / "out" / "checkpoints").exists()
