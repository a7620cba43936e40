"""Parquet files end to end: the Criteo preset trains, validates and predicts on typed Parquet columns, and a row
that does not fit the schema stops a run in one line."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest

from integration.recsys.builtin.tabular.test_tabular_presets import SMALL, criteo_line
from support.cli_runs import printed_by_main
from support.resume_helpers import check_ok, metric_history, one_line_error, run_recipes


def write(path: Path | str, columns: dict[str, Any], **options: Any) -> str:
    with fsspec.open(str(path), "wb") as file:
        pq.write_table(pa.table(columns), file, **options)
    return str(path)


def write_criteo_parquet(path: Path, num_rows: int, seed: int) -> str:
    """Criteo's columns, typed: an int label, int counts with nulls, hex strings with nulls."""
    rng = random.Random(seed)
    fields = [criteo_line(rng).split("\t") for _ in range(num_rows)]
    columns: dict[str, Any] = {"label": [int(f[0]) for f in fields]}
    columns |= {f"I{i}": pa.array([int(f[i]) if f[i] else None for f in fields], pa.int64()) for i in range(1, 14)}
    columns |= {f"C{i - 13}": [f[i] or None for f in fields] for i in range(14, 40)}
    return write(path, columns, row_group_size=1000)


def test_the_criteo_preset_trains_validates_and_predicts_parquet_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = {
        split: write_criteo_parquet(tmp_path / f"{split}.parquet", rows, seed)
        for seed, (split, rows) in enumerate((("train", 3000), ("valid", 700), ("test", 500)))
    }
    data = ["dataset.format=parquet", *(f"dataset.{split}_path={path}" for split, path in paths.items())]

    check_ok(run_recipes(tmp_path, "train", "criteo_kaggle", "-o", "out", *data, *SMALL, timeout=600))
    monkeypatch.chdir(tmp_path)
    predicted = printed_by_main(capsys, "predict", "out", "--split", "test", "-o", "test.csv")

    assert metric_history(tmp_path / "out")["valid"][-1]["auc"] > 0.7
    assert "test: auc=" in predicted
    assert pa_csv.read_csv(tmp_path / "test.csv").num_rows == 500

    bad = write(
        tmp_path / "bad.parquet",
        {"label": [1, 3], **{f"I{i}": [1, 2] for i in range(1, 14)}, **{f"C{i}": ["a", "b"] for i in range(1, 27)}},
    )
    result = run_recipes(
        tmp_path,
        "train",
        "criteo_kaggle",
        "-o",
        "bad",
        *data,
        f"dataset.valid_path={bad}",
        "dataset.max_malformed_rows=0",
        *SMALL,
    )
    assert result.returncode == 2
    assert f"Row 2 of file://{bad} does not fit the schema: the label `label` must be one of" in one_line_error(result)
