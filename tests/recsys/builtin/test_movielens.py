"""The shipped MovieLens data read through the ``movielens_small`` preset's schema: the time split, the joined
genres and tags, the derived columns, and bad ratings stopping a run in one line."""

from __future__ import annotations

import csv
import datetime
from pathlib import Path

import numpy as np
import pyarrow.csv as pa_csv
import pytest

from recipes.job import JobSpec, resolve_job
from recsys.click.batch import CTRBatch
from recsys.tabular.hashing import hash_value
from recsys.tabular.reader import TabularReader
from recsys.tabular.schema import TabularDataSection, resolve_path
from recsys.tabular.vocabulary import Encodings, load_or_build_encodings
from resume_helpers import check_ok, metric_history, one_line_error, run_recipes

NUM_RATINGS = 100_004
NUM_VALID = 20_001  # The latest fifth of the ratings, as `split.valid_from` cuts them.


def shipped_schema() -> TabularDataSection:
    dataset = resolve_job(JobSpec("movielens_small")).config.dataset  # type: ignore[attr-defined]
    assert isinstance(dataset, TabularDataSection)
    return dataset


def shipped_file(name: str) -> str:
    return resolve_path(f"package://recsys.builtin.movielens/ml-latest-small/{name}")


def read_split(schema: TabularDataSection, split: str, encodings: Encodings) -> list[CTRBatch]:
    reader = TabularReader(
        shipped_file("ratings.csv"),
        schema,
        split=split,
        encodings=encodings,
        batch_size=4096,
        shuffle=False,
        drop_last=False,
    )
    return [batch for step in reader for batch in step]


@pytest.fixture(scope="module")
def splits(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[CTRBatch]]:
    schema = shipped_schema()
    counting = TabularReader(shipped_file("ratings.csv"), schema, split="train", batch_size=1)
    path = str(tmp_path_factory.mktemp("encodings") / "vocabularies.npz")
    encodings = load_or_build_encodings(path, schema, counting.count_values)
    return {split: read_split(schema, split, encodings) for split in ("train", "valid")}


def ratings() -> list[dict[str, str]]:
    with open(shipped_file("ratings.csv"), newline="") as file:
        return list(csv.DictReader(file))


def test_the_time_split_validates_on_the_latest_fifth_of_the_ratings(splits: dict[str, list[CTRBatch]]) -> None:
    rows = ratings()
    valid_from = shipped_schema().split.valid_from
    expected = {
        "train": [r for r in rows if int(r["timestamp"]) < valid_from],  # type: ignore[operator]
        "valid": [r for r in rows if int(r["timestamp"]) >= valid_from],  # type: ignore[operator]
    }

    buckets = next(group.num_buckets for group in shipped_schema().categorical if "movieId" in group.columns)
    assert len(expected["valid"]) == NUM_VALID and len(rows) == NUM_RATINGS
    for split, batches in splits.items():
        labels = np.concatenate([batch.labels.numpy() for batch in batches])
        movies = np.concatenate([batch.sparse["movieId"].ids.numpy() for batch in batches])
        assert labels.tolist() == [float(float(r["rating"]) >= 4.0) for r in expected[split]]
        assert movies.tolist() == [hash_value(r["movieId"], "movieId", buckets) for r in expected[split]]


def test_genres_tags_and_time_parts_are_those_of_the_files(splits: dict[str, list[CTRBatch]]) -> None:
    first = ratings()[0]  # user 1 rated movie 31 ("Dangerous Minds (1995)", Drama) at 1260759144.
    with open(shipped_file("movies.csv"), newline="") as file:
        genres = next(row["genres"] for row in csv.DictReader(file) if row["movieId"] == first["movieId"])
    with open(shipped_file("tags.csv"), newline="") as file:
        valid_from = shipped_schema().split.valid_from
        tags = [
            row["tag"]
            for row in csv.DictReader(file)
            if row["movieId"] == first["movieId"] and int(row["timestamp"]) < valid_from  # type: ignore[operator]
        ]
    moment = datetime.datetime.fromtimestamp(int(first["timestamp"]), datetime.UTC)
    batch = splits["train"][0]

    def first_bag(name: str) -> list[int]:
        ids, offsets = batch.sparse[name].ids, batch.sparse[name].offsets
        return sorted(ids[offsets[0] : offsets[1]].tolist())

    buckets = {group_name: group.num_buckets for group in shipped_schema().categorical for group_name in group.columns}
    assert first_bag("genres") == sorted(hash_value(g, "genres", buckets["genres"]) for g in genres.split("|"))
    expected_tags = sorted(hash_value(t, "tag", buckets["tag"]) for t in tags) or [0]
    assert first_bag("tag") == expected_tags
    assert first_bag("hour") == [hash_value(str(moment.hour), "hour", buckets["hour"])]
    assert first_bag("weekday") == [hash_value(str(moment.weekday()), "weekday", buckets["weekday"])]


def test_the_popularity_counts_are_those_of_the_training_rows(splits: dict[str, list[CTRBatch]]) -> None:
    valid_from = shipped_schema().split.valid_from
    train_rows = [r for r in ratings() if int(r["timestamp"]) < valid_from]  # type: ignore[operator]
    movie_counts: dict[str, int] = {}
    for row in train_rows:
        movie_counts[row["movieId"]] = movie_counts.get(row["movieId"], 0) + 1
    dense_names = shipped_schema().dense_columns
    column = dense_names.index("movie_ratings")
    logged = next(group.log for group in shipped_schema().dense if "movie_ratings" in group.columns)

    dense = np.concatenate([batch.dense.numpy() for batch in splits["valid"]])[:, column]
    valid_rows = [r for r in ratings() if int(r["timestamp"]) >= valid_from]  # type: ignore[operator]
    counts = np.array([movie_counts.get(r["movieId"], 0) for r in valid_rows], np.float64)
    np.testing.assert_allclose(dense, np.log1p(counts) if logged else counts, rtol=1e-6)


@pytest.mark.parametrize("rating", ["nan", "inf", "4.x"])
def test_a_bad_rating_ends_training_in_one_line_with_exit_2(tmp_path: Path, rating: str) -> None:
    lines = Path(shipped_file("ratings.csv")).read_text().splitlines()[:200]
    user, movie, _, timestamp = lines[3].split(",")
    lines[3] = ",".join([user, movie, rating, timestamp])
    (tmp_path / "ratings.csv").write_text("\n".join(lines) + "\n")

    result = run_recipes(
        tmp_path,
        "train",
        "movielens_small",
        "-o",
        "out",
        "dataset.train_path=ratings.csv",
        "dataset.valid_path=ratings.csv",
        "dataset.max_malformed_rows=0",
    )

    assert result.returncode == 2
    assert "Line 4 of " in one_line_error(result) and "ratings.csv" in one_line_error(result)
    assert rating in one_line_error(result)
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_the_preset_trains_validates_and_predicts_a_test_split_cut_by_time(tmp_path: Path) -> None:
    times = sorted(int(r["timestamp"]) for r in ratings())
    test_from = times[NUM_RATINGS * 9 // 10]  # The latest tenth tests; the tenth before it validates.
    ratings_path = "package://recsys.builtin.movielens/ml-latest-small/ratings.csv"
    cut = [f"dataset.test_path={ratings_path}", f"dataset.split.test_from={test_from}"]
    short = ["trainer.max_num_steps=20", "trainer.validate_every_n_steps=10", "metrics.recorders.console=false"]

    check_ok(run_recipes(tmp_path, "train", "movielens_small", "-o", "out", *cut, *short, timeout=600))
    predicted = check_ok(run_recipes(tmp_path, "predict", "out", "--split", "test", "-o", "test.csv"))

    valid = metric_history(tmp_path / "out")["valid"]
    assert [entry["step"] for entry in valid] == [10, 20] and valid[-1]["auc"] > 0.6
    assert "test: auc=" in predicted.stdout
    assert pa_csv.read_csv(tmp_path / "test.csv").num_rows == sum(time >= test_from for time in times)


def test_a_split_that_leaves_validation_empty_stops_in_one_line_with_exit_2(tmp_path: Path) -> None:
    # Milliseconds for seconds: no rating is as late as this, so validation would score nothing.
    short = ["dataset.split.valid_from=1339227125000", "trainer.max_num_steps=4", "trainer.validate_every_n_steps=2"]

    result = run_recipes(tmp_path, "train", "movielens_small", "-o", "out", *short)

    assert result.returncode == 2
    assert "The evaluation data reader yields no step" in one_line_error(result)
    assert not (tmp_path / "out" / "checkpoints").exists()
