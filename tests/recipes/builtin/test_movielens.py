from __future__ import annotations

import csv
import logging
from pathlib import Path
from typing import Literal

import fsspec
import numpy as np
import pytest
import torch

from gang import FakeGang
from recipes.builtin.movielens.reader import MovieLensData, MovieLensReader, load_movielens
from recipes.builtin.movielens.recipe import SHIPPED_DATA
from recipes.cli import main
from recipes.click.batch import CTRBatch
from recipes.click.models import DLRM, CTRModel
from recipes.data.reader import DataError
from recipes.models.embeddings import EmbeddingSection, TableSpec, build_embeddings

SHIPPED = Path(SHIPPED_DATA)

MOVIES = """movieId,title,genres
10,"Heat, The (1995)",Action|Crime
2,Toy Story (1995),Comedy|Animation
7,Nothing (2000),(no genres listed)
"""
# 2001-09-09 01:46:40 UTC (a Sunday), 2001-09-10 13:00:00 UTC (a Monday), 2003-01-01 00:00:00 UTC.
RATINGS = """userId,movieId,rating,timestamp
5,10,4.0,1000000000
3,2,3.5,1000126800
5,7,5.0,1041379200
"""


def write_dataset(directory: Path, movies: str = MOVIES, ratings: str = RATINGS) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "movies.csv").write_text(movies)
    (directory / "ratings.csv").write_text(ratings)
    return str(directory)


def rows_of(steps: list[list[CTRBatch]]) -> list[list[list[int]]]:
    """Per step, per micro-batch, the (user, movie, year) triples flattened into row keys."""
    return [[(b.sparse["user"].ids * 1_000_000 + b.sparse["movie"].ids).tolist() for b in step] for step in steps]


def test_hand_written_files_give_exact_features(tmp_path: Path) -> None:
    data = load_movielens(write_dataset(tmp_path / "ml"))

    assert data.vocab_sizes == {"user": 2, "movie": 3, "genres": 5, "hour": 24, "weekday": 7, "year": 3}
    assert data.users.tolist() == [1, 0, 1]  # users 3 and 5
    assert data.movies.tolist() == [2, 0, 1]  # movies 2, 7, 10
    assert data.hours.tolist() == [1, 13, 0]
    assert data.weekdays.tolist() == [6, 0, 2]
    assert data.years.tolist() == [0, 0, 2]
    assert data.labels.tolist() == [1.0, 0.0, 1.0]

    reader = MovieLensReader(data, np.arange(3), batch_size=3, shuffle=False)
    [[batch]] = list(reader)
    # Genres sorted: (no genres listed)=0, Action=1, Animation=2, Comedy=3, Crime=4.
    assert batch.sparse["genres"].ids.tolist() == [1, 4, 2, 3, 0]
    assert batch.sparse["genres"].offsets.tolist() == [0, 2, 4, 5]
    assert batch.sparse["movie"].offsets.tolist() == [0, 1, 2, 3]
    span = 1041379200 - 1000000000
    torch.testing.assert_close(batch.dense[:, 0], torch.tensor([0.0, 126800 / span, 1.0]))
    assert batch.labels.tolist() == [1.0, 0.0, 1.0]


@pytest.mark.parametrize(
    ("ratings", "message"),
    [
        (
            "userId,movieId,rating,timestamp\n1,2,3.0\n",
            r"Line 2 of .*ratings.csv is malformed: it must have 4",
        ),
        ("userId,movieId,rating,timestamp\n1,2,3.0,5\n1,x,3.0,5\n", r"Line 3 .* `movieId` must be a int"),
        ("userId,movieId,rating,timestamp\n1,99,3.0,5\n", r"Line 2 .* movieId 99 is not in movies.csv"),
        ("user,movie,rating,timestamp\n", r"The header of .*ratings.csv must be"),
        ("userId,movieId,rating,timestamp\n", r"ratings.csv must hold at least one rating"),
    ],
)
def test_malformed_files_are_data_errors_naming_file_and_line(tmp_path: Path, ratings: str, message: str) -> None:
    with pytest.raises(DataError, match=message):
        load_movielens(write_dataset(tmp_path / "ml", ratings=ratings))


@pytest.mark.parametrize("rating", ["nan", "inf", "-inf", "NaN", "1e999"])
def test_a_non_finite_rating_is_a_data_error_naming_file_and_line(tmp_path: Path, rating: str) -> None:
    path = write_dataset(tmp_path / "ml", ratings=RATINGS + f"3,10,{rating},1000000001\n")

    with pytest.raises(DataError) as info:
        load_movielens(path)

    assert str(info.value) == (
        f"Line 5 of {path}/ratings.csv is malformed: `rating` must be a finite number, but is '{rating}' instead."
    )


def test_a_non_finite_rating_ends_training_in_one_line_with_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_dataset(tmp_path / "ml", ratings=RATINGS.replace("3.5", "nan"))
    monkeypatch.chdir(tmp_path)

    code = main(["train", "movielens_small", "-o", "out", f"dataset.path={path}", "metrics.console=false"])

    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert lines == [
        f"error: Line 3 of {path}/ratings.csv is malformed: `rating` must be a finite number, but is 'nan' instead."
    ]


def test_missing_files_are_data_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"movies.csv must exist"):
        load_movielens(str(tmp_path / "nowhere"))


def test_memory_filesystem_paths() -> None:
    for name, text in (("movies.csv", MOVIES), ("ratings.csv", RATINGS)):
        with fsspec.open(f"memory://ml/{name}", "wt") as file:
            file.write(text)

    assert load_movielens("memory://ml").num_ratings == 3


@pytest.fixture(scope="module")
def shipped() -> MovieLensData:
    return load_movielens(str(SHIPPED))


def test_shipped_data_vocabularies_come_from_the_files(shipped: MovieLensData) -> None:
    with open(SHIPPED / "ratings.csv", newline="") as file:
        ratings = list(csv.DictReader(file))
    with open(SHIPPED / "movies.csv", newline="") as file:
        movies = list(csv.DictReader(file))

    assert shipped.num_ratings == len(ratings)
    assert shipped.vocab_sizes["user"] == len({r["userId"] for r in ratings})
    assert shipped.vocab_sizes["movie"] == len({m["movieId"] for m in movies})
    assert shipped.vocab_sizes["genres"] == len({g for m in movies for g in m["genres"].split("|")})
    for name, size in shipped.vocab_sizes.items():
        ids = {"user": shipped.users, "movie": shipped.movies, "genres": shipped.genre_ids}.get(name)
        if ids is not None:
            assert ids.min() >= 0 and ids.max() < size
    assert 0.4 < shipped.labels.mean() < 0.6


@pytest.mark.parametrize("method", ["time", "random"])
def test_splits_are_disjoint_and_cover_every_rating(shipped: MovieLensData, method: str) -> None:
    train, valid = shipped.split(method, valid_fraction=0.2, seed=1)  # type: ignore[arg-type]

    assert len(np.intersect1d(train, valid)) == 0
    assert np.array_equal(np.sort(np.concatenate([train, valid])), np.arange(shipped.num_ratings))
    assert len(valid) == round(shipped.num_ratings * 0.2)
    if method == "time":
        assert shipped.timestamps[train].max() <= shipped.timestamps[valid].min()
    else:
        assert np.array_equal(valid, shipped.split("random", valid_fraction=0.2, seed=1)[1])


def test_two_ranks_share_every_row_once_with_equal_step_counts(shipped: MovieLensData) -> None:
    rows = np.arange(1000)

    def read(rank: int) -> list[list[CTRBatch]]:
        reader = MovieLensReader(shipped, rows, batch_size=16, num_accumulate=3, dp_rank=rank, dp_size=2, seed=4)
        return list(reader)

    rank_0, rank_1 = read(0), read(1)
    assert len(rank_0) == len(rank_1) == 1000 // 96
    keys = [k for rank in (rank_0, rank_1) for step in rows_of(rank) for batch in step for k in batch]
    expected = (shipped.users[:1000] * 1_000_000 + shipped.movies[:1000]).tolist()
    assert len(keys) == 960
    assert set(keys) <= set(expected)
    assert len(set(keys)) == len(keys) == len(set(keys) & set(expected))


@pytest.mark.parametrize("shuffle", [False, True])
def test_resume_mid_epoch_reads_what_an_uninterrupted_run_reads(shipped: MovieLensData, shuffle: bool) -> None:
    def reader() -> MovieLensReader:
        return MovieLensReader(shipped, np.arange(500, 900), batch_size=8, num_accumulate=2, shuffle=shuffle)

    uninterrupted = reader()
    uninterrupted.reset()
    expected = rows_of(list(uninterrupted))

    interrupted = reader()
    interrupted.reset()
    head = rows_of([next(interrupted) for _ in range(7)])
    resumed = reader()
    resumed.load_state_dict(interrupted.state_dict())

    assert head + rows_of(list(resumed)) == expected
    first_epoch = rows_of(list(reader()))
    assert (first_epoch != expected) == shuffle


def rating_keys(steps: list[list[CTRBatch]]) -> list[int]:
    """The ratings a rank read over an epoch, as (user, movie) keys, in the order it read them."""
    return [key for step in rows_of(steps) for batch in step for key in batch]


def interleave(per_rank: list[list[int]]) -> list[int]:
    """The epoch's order back from the ranks' reads: rating ``p`` is rank ``p % dp``'s ``p // dp``-th."""
    dp_size = len(per_rank)
    return [per_rank[p % dp_size][p // dp_size] for p in range(sum(len(reads) for reads in per_rank))]


def keys_of(data: MovieLensData, rows: np.ndarray) -> list[int]:
    return [int(key) for key in data.users[rows] * 1_000_000 + data.movies[rows]]


@pytest.mark.parametrize("num_accumulate", [1, 3])
@pytest.mark.parametrize("dp_size", [1, 2, 3])
def test_without_drop_last_the_ranks_read_every_rating_once_in_input_order(
    shipped: MovieLensData, dp_size: int, num_accumulate: int
) -> None:
    rows = np.arange(7, 3000, 3)  # 998 ratings: no whole number of steps for any of the layouts.

    readers = [
        MovieLensReader(
            shipped,
            rows,
            batch_size=16,
            num_accumulate=num_accumulate,
            dp_rank=rank,
            dp_size=dp_size,
            shuffle=False,
            drop_last=False,
        )
        for rank in range(dp_size)
    ]
    epochs = [list(reader) for reader in readers]

    num_steps = -(-len(rows) // (16 * num_accumulate * dp_size))
    assert [len(steps) for steps in epochs] == [num_steps] * dp_size
    assert {reader.num_steps_per_epoch for reader in readers} == {num_steps}
    assert interleave([rating_keys(steps) for steps in epochs]) == keys_of(shipped, rows)


@pytest.mark.parametrize("dp_size", [2, 3])
def test_without_drop_last_a_shuffled_epoch_reads_every_rating_once(shipped: MovieLensData, dp_size: int) -> None:
    rows = np.arange(1000)
    readers = [
        MovieLensReader(shipped, rows, batch_size=16, dp_rank=rank, dp_size=dp_size, seed=4, drop_last=False)
        for rank in range(dp_size)
    ]

    keys = [key for reader in readers for key in rating_keys(list(reader))]

    assert sorted(keys) == sorted(keys_of(shipped, rows))


def test_a_rank_the_short_last_step_does_not_reach_reads_a_valid_zero_row_batch(shipped: MovieLensData) -> None:
    # 961 ratings, steps of 3 ranks x 16: twenty full steps, then one rating, for rank 0 only.
    readers = [
        MovieLensReader(shipped, np.arange(961), batch_size=16, dp_rank=r, dp_size=3, shuffle=False, drop_last=False)
        for r in range(3)
    ]

    last_batches = [list(reader)[-1] for reader in readers]

    assert [[batch.batch_size for batch in step] for step in last_batches] == [[1], [0], [0]]
    empty = last_batches[1][0]
    assert empty.dense.shape == (0, 1) and empty.dense.dtype == torch.float32
    assert empty.labels.shape == (0,) and empty.labels.dtype == torch.float32
    assert set(empty.sparse) == {"user", "movie", "genres", "hour", "weekday", "year"}
    for feature in empty.sparse.values():
        assert feature.ids.shape == (0,) and feature.ids.dtype == torch.int64
        assert feature.offsets.tolist() == [0] and feature.offsets.dtype == torch.int64


@pytest.mark.parametrize("backend", ["sparse", "dense"])
def test_the_click_models_score_a_zero_row_batch(shipped: MovieLensData, backend: Literal["sparse", "dense"]) -> None:
    # One rating over two ranks: rank 1's one step has no row.
    reader = MovieLensReader(shipped, np.arange(1), batch_size=2, dp_rank=1, dp_size=2, drop_last=False)
    [[empty]] = list(reader)
    assert empty.batch_size == 0

    names = ["user", "movie", "genres", "hour", "weekday", "year"]
    tables = [TableSpec(name, shipped.vocab_sizes[name], (name,)) for name in names]
    section = EmbeddingSection(dim=4, backend=backend)
    models = [
        CTRModel(build_embeddings(section, tables, FakeGang(), seed=0), names, 4, 1, [8]),
        DLRM(build_embeddings(section, tables, FakeGang(), seed=0), names, 1, 4, [8], [8]),
    ]
    for model in models:
        with torch.no_grad():
            assert model(empty).shape == (0,)
        model(empty).sum().backward()  # A training step over no rows still runs.


@pytest.mark.parametrize("stop_after", [0, 3, 12, 13])
def test_without_drop_last_resume_mid_epoch_reads_what_an_uninterrupted_run_reads(
    shipped: MovieLensData, stop_after: int
) -> None:
    def reader() -> MovieLensReader:
        # 401 ratings, steps of 2 ranks x 2 x 8: twelve full steps and a short one of 17 ratings.
        return MovieLensReader(
            shipped, np.arange(500, 901), batch_size=8, num_accumulate=2, dp_rank=1, dp_size=2, drop_last=False
        )

    uninterrupted = reader()
    uninterrupted.reset()
    expected = rows_of(list(uninterrupted))

    interrupted = reader()
    interrupted.reset()
    head = rows_of([next(interrupted) for _ in range(stop_after)])
    resumed = reader()
    resumed.load_state_dict(interrupted.state_dict())

    assert head + rows_of(list(resumed)) == expected
    assert [len(batch) for batch in expected[-1]] == [4, 4]


def test_drop_last_logs_once_per_epoch_how_many_ratings_it_dropped(
    shipped: MovieLensData, caplog: pytest.LogCaptureFixture
) -> None:
    # 1000 ratings, steps of 2 ranks x 3 x 16: 40 dropped.
    reader = MovieLensReader(shipped, np.arange(1000), batch_size=16, num_accumulate=3, dp_rank=0, dp_size=2)

    with caplog.at_level(logging.INFO, logger="recipes.builtin.movielens.reader"):
        list(reader)
        list(reader)  # Past the end: nothing more to say.
        reader.reset()
        list(reader)
        full = MovieLensReader(shipped, np.arange(960), batch_size=16, num_accumulate=3, dp_rank=0, dp_size=2)
        list(full)

    assert [record.getMessage().split(":")[0] for record in caplog.records] == [
        "Data epoch 0 dropped its last 40 rows",
        "Data epoch 1 dropped its last 40 rows",
    ]
    assert all(record.levelno == logging.INFO for record in caplog.records)
