"""The files of a split, as ``python -m recipes train`` meets them (GitHub issue 45): a validation split of no row
stops the run before its first step, and every message about a split's files names its config key."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.resume_helpers import one_line_error, run_recipes

HEADER = "id,click,hour,C1,site_id\n"
SMALL = ["dataset.batch_size=16", "metrics.recorders.console=false", "trainer.max_num_steps=4"]
SCHEMA = ["dataset.categorical=[{columns: [C1, site_id]}]", "dataset.dense=[]", "dataset.label.column=click"]


def write_rows(path: Path, num_rows: int, click_every: int = 2) -> str:
    """Rows of which every ``click_every``-th is a click (0: none is)."""
    rows = (
        f"{i},{int(click_every > 0 and i % click_every == 0)},141021{i % 24:02d},1005,s{i % 7}\n"
        for i in range(num_rows)
    )
    path.write_text(HEADER + "".join(rows))
    return str(path)


@pytest.mark.parametrize(
    ("valid_text", "line"),
    [
        (HEADER, "`dataset.valid_path` must name data that holds rows, but file://{valid} holds none"),
        ("", "`dataset.valid_path` must name files that start with a header line, but file://{valid} is empty."),
        (None, "`dataset.valid_path` must name existing files, but file://{valid} does not exist."),
    ],
    ids=["header_only", "empty", "missing"],
)
def test_validation_files_of_no_row_stop_before_the_first_step_naming_the_key(
    tmp_path: Path, valid_text: str | None, line: str
) -> None:
    train = write_rows(tmp_path / "train.csv", 200)
    valid = tmp_path / "valid.csv"
    if valid_text is not None:
        valid.write_text(valid_text)
    data = [f"dataset.train_path={train}", f"dataset.valid_path={valid}", *SCHEMA]

    result = run_recipes(tmp_path, "train", "avazu", "-o", "out", *data, *SMALL)

    assert result.returncode == 2, result.stderr
    assert line.format(valid=valid) in one_line_error(result)
    assert not list((tmp_path / "out").glob("metrics/*.jsonl"))  # Not a step was trained.
    assert not (tmp_path / "out" / "checkpoints").exists() or not list((tmp_path / "out" / "checkpoints").iterdir())


def test_a_validation_split_of_one_class_stops_the_run_at_its_validation_before_any_checkpoint(tmp_path: Path) -> None:
    """Once it scored auc=0 and ne=4.6e11, and those chose the best checkpoint."""
    train = write_rows(tmp_path / "train.csv", 200)
    valid = write_rows(tmp_path / "valid.csv", 30, click_every=0)

    data = [f"dataset.train_path={train}", f"dataset.valid_path={valid}", *SCHEMA]

    result = run_recipes(tmp_path, "train", "avazu", "-o", "out", *data, *SMALL)

    assert result.returncode == 2, result.stderr
    assert one_line_error(result) == (
        "error: `trainer.score_metric` valid/auc must be a number to rank checkpoints, but is NaN at the validation of "
        "step 4: the data holds only label 0 (30 rows)."
    )
    assert not (tmp_path / "out" / "checkpoints").exists() or not list((tmp_path / "out" / "checkpoints").iterdir())


def test_a_file_sorted_by_time_whose_first_rows_all_go_to_training_validates(tmp_path: Path) -> None:
    """The start-up check counts the records of a file, not whether the split keeps them: a log sorted by time,
    validated on its last rows, begins with more training rows than the check reads (once refused as holding none)."""
    rows = [f"{i},{i % 2},{1_400_000_000 + i},1005,s{i % 7}\n" for i in range(6000)]
    log = tmp_path / "log.csv"
    log.write_text("id,click,ts,C1,site_id\n" + "".join(rows))
    assert len(log.read_bytes()) > 2 * 65536  # More than the check's first read of the file.
    split = ["dataset.split.column=ts", "dataset.split.valid_from=1400005900"]
    data = [f"dataset.train_path={log}", f"dataset.valid_path={log}", *SCHEMA, *split]

    result = run_recipes(tmp_path, "train", "avazu", "-o", "out", *data, *SMALL)

    assert result.returncode == 0, result.stderr
    assert list((tmp_path / "out" / "checkpoints").glob("step_4"))
