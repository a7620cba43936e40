"""The MovieLens-1M presets as a user runs them, on files in ML-1M's own byte format (``support.movielens_1m``:
``::``-separated, no header, Latin-1 titles): the genres joined from ``movies.dat`` reach the model, the time split
validates, and a folder not given stops in one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recsys.tabular.hashing import text_keys
from support.cli_runs import assert_one_line_error, run_main
from support.movielens_1m import VALID_FROM, movie_genres, write_movielens_1m
from support.resume_helpers import check_ok, metric_history, run_recipes

SHORT = [
    "dataset.data_dir=ml-1m",
    "dataset.batch_size=64",
    "trainer.max_num_steps=4",
    "trainer.validate_every_n_steps=4",
    "metrics.recorders.console=false",
]


def training_genres(folder: Path) -> set[int]:
    """The keys of the genres of the movies of the training rows."""
    movies = {line.split("::")[1] for line in (folder / "ratings.dat").read_text().splitlines()
              if int(line.split("::")[3]) < VALID_FROM}  # fmt: skip
    genres = {genre for movie in movies for genre in movie_genres(int(movie)).split("|")}
    return {int(key) for key in text_keys(pa.array(sorted(genres)), "genres").view(np.int64)}


def test_din_takes_the_genres_of_movies_dat_and_validates_on_the_later_ratings(tmp_path: Path) -> None:
    folder = write_movielens_1m(tmp_path / "ml-1m")
    # Hash tables hold a row for each value trained on, which `export-tables` lists by key.
    check_ok(run_recipes(tmp_path, "train", "movielens_1m_din", "-o", "out", *SHORT, "model.embeddings.kind=hash"))
    check_ok(run_recipes(tmp_path, "export-tables", "out", "-o", "tables"))

    trained = set(pq.read_table(tmp_path / "tables/genres.parquet").column("id").to_pylist())
    assert len(trained) >= 10 and trained <= training_genres(folder)  # 12 genres in all, none empty
    valid = metric_history(tmp_path / "out")["valid"][-1]
    assert valid["gauc_groups"] > 0 and 0 < valid["positive_rate"] < 1


def test_multitask_scores_both_tasks_on_the_later_ratings(tmp_path: Path) -> None:
    write_movielens_1m(tmp_path / "ml-1m")

    check_ok(run_recipes(tmp_path, "train", "movielens_1m_multitask", "-o", "out", *SHORT))

    valid = metric_history(tmp_path / "out")["valid"][-1]
    assert 0 <= valid["liked/auc"] <= 1 and valid["rating/mse"] > 0 and valid["liked/gauc_groups"] > 0


def test_a_preset_of_ml_1m_without_its_folder_stops_in_one_line_naming_data_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)

    code, _, err = run_main(capsys, "train", "movielens_1m_din", "-o", str(tmp_path / "out"))

    assert code == 2
    assert_one_line_error(err, "`dataset.train_path` is 'ratings.dat'", "set `dataset.data_dir`")
