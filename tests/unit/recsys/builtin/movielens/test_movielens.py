"""The shipped MovieLens data read through the ``movielens_small`` preset's schema: the time split, the joined
genres and tags, and the derived columns."""

from __future__ import annotations

import csv
import datetime

import numpy as np
import pyarrow as pa
import pytest

from recipes.cli.job import resolve_job
from recipes.cli.job_spec import JobSpec
from recsys.click.batch import CTRBatch
from recsys.tabular.formats.delimited_text import TabularReader
from recsys.tabular.hashing import hash_ids, hash_value
from recsys.tabular.schema import TabularDataSection, resolve_path
from recsys.tabular.vocabulary import Encodings, load_or_build_encodings

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
        # One value's id is hash_value's (recsys.tabular.hashing); hash_ids gives each value of an array that id.
        movie_ids = pa.array([r["movieId"] for r in expected[split]])
        assert movies.tolist() == hash_ids(movie_ids, "movieId", buckets).tolist()


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
