"""The ``movielens_small`` preset split leave-one-out, as a user runs it: it trains, and its validation and test
splits hold one rating of each user; a misused split stops in one line with exit 2."""

from __future__ import annotations

import csv
from pathlib import Path

import pyarrow.csv as pa_csv
import pytest

from recsys.tabular.schema import resolve_path
from support.cli_runs import assert_one_line_error, printed_by_main, run_main

RATINGS = "package://recsys.builtin.movielens/ml-latest-small/ratings.csv"
LEAVE_ONE_OUT = ["dataset.split.valid_from=null", "dataset.split.last_of=userId", "dataset.split.tie_break=movieId"]


def num_users() -> int:
    with open(resolve_path(RATINGS), newline="") as file:
        return len({row["userId"] for row in csv.DictReader(file)})


def test_the_preset_trains_leave_one_out_and_scores_one_rating_per_user(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    short = ["trainer.max_num_steps=4", "trainer.validate_every_n_steps=2", "metrics.recorders.console=false"]
    monkeypatch.chdir(tmp_path)

    printed_by_main(
        capsys, "train", "movielens_small", "-o", "out", f"dataset.test_path={RATINGS}", *LEAVE_ONE_OUT, *short
    )
    for split in ("valid", "test"):
        printed_by_main(capsys, "predict", "out", "--split", split, "-o", f"{split}.csv")

    users = num_users()
    assert users == 671  # The shipped ml-latest-small (2016): 100,004 ratings of 671 users.
    assert pa_csv.read_csv(tmp_path / "valid.csv").num_rows == users
    assert pa_csv.read_csv(tmp_path / "test.csv").num_rows == users


@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        (["dataset.split.last_of=userId"], ["`split.valid_from` must be unset with `last_of`"]),
        (
            ["dataset.split.valid_from=null", "dataset.split.last_of=user_id"],
            ["`split.last_of`, must be a column of", "'user_id' is neither"],
        ),
        (
            ["dataset.split.valid_from=null", "dataset.split.column=null", "dataset.split.last_of=userId"],
            ["`split.column` must name the column that orders the rows of each `last_of` key"],
        ),
    ],
)
def test_a_misused_leave_one_out_split_stops_in_one_line_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], overrides: list[str], fragments: list[str]
) -> None:
    code, _, err = run_main(capsys, "train", "movielens_small", "-o", str(tmp_path / "out"), *overrides)

    assert code == 2
    assert_one_line_error(err, *fragments)
