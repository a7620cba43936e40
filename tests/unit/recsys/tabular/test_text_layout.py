"""Text files of other layouts: a delimiter of several characters (MovieLens-1M's ``::``), an encoding (its Latin-1
titles), joined tables in such files, and the folder of a preset's files (``data_dir``)."""

from __future__ import annotations

import csv
import random
from pathlib import Path
from typing import Any

import pytest

from recipes import ConfigError
from recipes.training.data_reader import DataError
from recsys.tabular.formats.delimited_text import CsvConfig, TabularReader, TsvConfig
from recsys.tabular.hashing import hash_value
from recsys.tabular.labels import LabelColumn
from recsys.tabular.schema import (
    CategoricalColumns,
    DenseColumns,
    DerivedColumn,
    JoinedTable,
    SplitByValue,
    TabularDataSection,
    WindowsSection,
)
from recsys.tabular.split_files import refuse_unlocated_paths
from recsys.tabular.text_layout import TextLayout
from recsys.tabular.window_sources import ColumnWindows
from support.movielens_1m import TITLES, VALID_FROM, movie_genres, write_movielens_1m

DAT = {"delimiter": "::", "quote_char": None, "header": False}


def ml1m_schema(folder: Path, **overrides: Any) -> TabularDataSection:
    """MovieLens-1M's ratings with the genres and title of movies.dat, as the ``movielens_1m_*`` presets read them."""
    movies = CsvConfig(**DAT, encoding="latin-1", column_names=["movieId", "title", "genres"])
    values: dict[str, Any] = {
        "format": CsvConfig(**DAT, column_names=["userId", "movieId", "rating", "timestamp"]),
        "label": LabelColumn(column="rating", threshold=4.0),
        "joins": [
            JoinedTable(path=str(folder / "movies.dat"), key="movieId", columns=["genres", "title"], format=movies)
        ],
        "categorical": [
            CategoricalColumns(columns=["userId", "movieId", "title"], num_buckets=1000),
            CategoricalColumns(columns=["genres"], separator="|", num_buckets=1000),
        ],
        "split": SplitByValue(column="timestamp", valid_from=VALID_FROM),
    }
    values.update(overrides)
    return TabularDataSection(**values)


def rows(path: Path | str, data: TabularDataSection, split: str = "train", **options: Any) -> list[Any]:
    settings: dict[str, Any] = {"batch_size": 1, "shuffle": False, "drop_last": False, "max_malformed_rows": 0}
    reader = TabularReader(str(path), data, split=split, **(settings | options))
    return [batch for step in reader for batch in step]


def ids(batch: Any, name: str) -> list[int]:
    return batch.sparse[name].ids.tolist()  # type: ignore[no-any-return]


def test_movielens_1m_files_read_with_their_joined_genres_and_latin_1_titles(tmp_path: Path) -> None:
    folder = write_movielens_1m(tmp_path)
    data = ml1m_schema(folder)
    lines = [line.split("::") for line in (folder / "ratings.dat").read_text("latin-1").splitlines()]

    train, valid = rows(folder / "ratings.dat", data, "train"), rows(folder / "ratings.dat", data, "valid")

    expected = {
        split: [f for f in lines if (int(f[3]) >= VALID_FROM) == (split == "valid")] for split in ("train", "valid")
    }
    assert len(train) == len(expected["train"]) and len(valid) == len(expected["valid"]) > 0
    for batch, (user, movie, rating, _) in zip(train + valid, expected["train"] + expected["valid"]):
        assert batch.labels.item() == float(int(rating) >= 4)
        assert ids(batch, "userId") == [hash_value(user, "userId", 1000)]
        assert ids(batch, "genres") == [hash_value(g, "genres", 1000) for g in movie_genres(int(movie)).split("|")]
        # Read from Latin-1 bytes, the title has the id of its text (as in a UTF-8 file): "Misérables, Les (1995)".
        assert ids(batch, "title") == [hash_value(TITLES[(int(movie) - 1) % len(TITLES)], "title", 1000)]


def random_fields(rng: random.Random) -> list[str]:
    """A line's fields as the csv module writes them (quoted where they hold the delimiter or a quote): colons,
    double colons, commas, quotes and spaces inside values."""
    pieces = ["a", "b:c", "d::e", "f,g", 'h"i', " j ", "é", ":", ""]
    return [
        str(rng.randint(0, 1)),
        str(rng.uniform(-5, 5)),
        "".join(rng.choice(pieces) for _ in range(rng.randint(0, 3))),
        "|".join(rng.choice(pieces) for _ in range(rng.randint(1, 3))),
    ]


def quoted(value: str) -> str:
    return '"' + value.replace('"', '""') + '"' if ":" in value or '"' in value else value


@pytest.mark.parametrize("seed", [0, 1])
def test_a_long_delimiter_reads_as_a_comma_does_quotes_and_all(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    table = [random_fields(rng) for _ in range(200)]
    with open(tmp_path / "comma.csv", "w", newline="", encoding="utf-8") as file:
        csv.writer(file).writerows([["click", "x", "city", "tags"], *table])
    # A value holding a colon or a quote is quoted (its quotes doubled), the others are not.
    lines = ["::".join(quoted(value) for value in row) for row in [["click", "x", "city", "tags"], *table]]
    (tmp_path / "colons.csv").write_text("\r\n".join(lines) + "\r\n", encoding="utf-8")
    common: dict[str, Any] = {
        "label": LabelColumn(column="click"),
        "dense": [DenseColumns(columns=["x"])],
        "categorical": [
            CategoricalColumns(columns=["city"], num_buckets=1000),
            CategoricalColumns(columns=["tags"], separator="|", num_buckets=1000),
        ],
    }

    comma = rows(tmp_path / "comma.csv", TabularDataSection(format=CsvConfig(), **common))
    colons = rows(tmp_path / "colons.csv", TabularDataSection(format=CsvConfig(delimiter="::"), **common))

    assert len(colons) == len(comma) == 200
    for a, b in zip(comma, colons):
        assert a.labels.item() == b.labels.item() and a.dense.tolist() == b.dense.tolist()
        assert ids(a, "city") == ids(b, "city") and ids(a, "tags") == ids(b, "tags")


def test_a_bad_line_of_a_long_delimited_latin_1_file_is_named_by_its_line(tmp_path: Path) -> None:
    lines = ["1::Misérables::4", "2::Cité::x", "3::Être::5"]
    (tmp_path / "r.dat").write_bytes("\n".join(lines).encode("latin-1") + b"\n")
    data = TabularDataSection(
        format=CsvConfig(**DAT, encoding="latin-1", column_names=["user", "title", "rating"]),
        label=LabelColumn(column="rating", threshold=4.0),
        categorical=[CategoricalColumns(columns=["user", "title"], num_buckets=100)],
    )

    with pytest.raises(
        DataError,
        match=r"Line 2 of .*r\.dat is malformed: the label `rating` must be a finite number, but is 'x' instead",
    ):
        rows(tmp_path / "r.dat", data)


def test_the_line_ends_of_a_file_are_kept_under_the_stand_in_delimiter() -> None:
    raw = b'a::"b::c"::d\n"e""::"::f\n\n' + "é::g\r\n".encode("latin-1")
    text, stand_in = TextLayout("::", '"', "latin-1").normalize(raw)

    assert text.count(b"\n") == raw.count(b"\n")
    s = stand_in
    assert text.decode().split("\n") == [f'a{s}"b::c"{s}d', f'"e""::"{s}f', "", f"é{s}g\r", ""]


def test_text_not_of_the_encoding_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "r.csv").write_bytes("user,rating\nMisérables,4\n".encode("latin-1"))
    data = TabularDataSection(
        format=CsvConfig(encoding="ascii"),
        label=LabelColumn(column="rating", threshold=4.0),
        categorical=[CategoricalColumns(columns=["user"], num_buckets=100)],
    )

    with pytest.raises(DataError, match=r"r\.csv must be ascii text .* but is not: ordinal not in range"):
        rows(tmp_path / "r.csv", data)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"delimiter": '"|'}, "`delimiter` must not hold the quote character"),
        ({"delimiter": ":\n"}, "`delimiter` must be one or more characters other than line ends"),
        ({"encoding": "klingon"}, "`encoding` must be a text encoding Python knows"),
        ({"encoding": "utf-16"}, "`encoding` must write ASCII as ASCII"),
        ({"quote_char": "''"}, "`quote_char` must be one ASCII character or null"),
    ],
)
def test_a_layout_that_cannot_be_read_is_refused_in_one_line(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CsvConfig(**options)


def test_a_join_in_a_format_that_reads_no_whole_table_is_refused() -> None:
    from recsys.tabular.formats.libsvm import LibSVMConfig

    with pytest.raises(ValueError, match="A join's `format` must be one that reads a whole side table"):
        JoinedTable(path="m.txt", key="movieId", columns=["genres"], format=LibSVMConfig())


def test_a_tsv_join_with_a_header_and_cp1252_text(tmp_path: Path) -> None:
    (tmp_path / "r.csv").write_text("movie,rating\n1,5\n2,1\n")
    (tmp_path / "m.txt").write_bytes("movie\tname\n1\tCaf\xe9 \x93Noir\x94\n".encode("latin-1"))
    data = TabularDataSection(
        label=LabelColumn(column="rating", threshold=4.0),
        joins=[
            JoinedTable(
                path=str(tmp_path / "m.txt"), key="movie", columns=["name"], format=TsvConfig(encoding="cp1252")
            )
        ],
        categorical=[CategoricalColumns(columns=["movie", "name"], num_buckets=100)],
    )

    assert [ids(b, "name") for b in rows(tmp_path / "r.csv", data)] == [[hash_value("Café “Noir”", "name", 100)], [0]]


def test_data_dir_locates_the_relative_paths_and_no_other(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    data = ml1m_schema(
        Path("."), data_dir="ml-1m", train_path="ratings.dat", valid_path="/abs/r.dat", test_path="s3://b/r"
    )

    assert (data.train_path, data.valid_path, data.test_path) == (
        f"{tmp_path}/ml-1m/ratings.dat",
        "/abs/r.dat",
        "s3://b/r",
    )
    assert data.joins[0].path == f"{tmp_path}/ml-1m/movies.dat"
    again = ml1m_schema(Path("."), data_dir="ml-1m", train_path=data.train_path, valid_path="x")
    assert again.train_path == data.train_path  # A run's config, read again, keeps its paths.


def test_a_relative_path_found_nowhere_names_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "here.dat").write_text("")
    refuse_unlocated_paths({"dataset.train_path": "here.dat", "dataset.test_path": None}, None)
    refuse_unlocated_paths({"dataset.train_path": "ratings.dat"}, "/data/ml-1m")

    with pytest.raises(
        ConfigError, match=r"^`dataset.train_path` is 'ratings.dat', relative .* set `dataset.data_dir`"
    ):
        refuse_unlocated_paths({"dataset.train_path": "ratings.dat"}, None)


def test_windows_by_column_of_a_long_delimited_latin_1_file_keep_its_bytes(tmp_path: Path) -> None:
    lines = [f"{k}::Misérables, Les: {k}::{ts}\n".encode("latin-1") for k, ts in enumerate([86400 + 5, 7, 86400 + 1])]
    (tmp_path / "r.dat").write_bytes(b"".join(lines))
    data = TabularDataSection(
        format=CsvConfig(**DAT, encoding="latin-1", column_names=["k", "title", "ts"]),
        label=LabelColumn(column="k"),
        split=SplitByValue(column="ts", valid_from=10 * 86400),
        windows=WindowsSection(by="column"),
    )

    windows = ColumnWindows(str(tmp_path / "r.dat"), data, "ts", 86400, str(tmp_path / "w")).windows()

    assert [w.start for w in windows] == [0, 86400]
    assert [Path(w.paths[0].removeprefix("file://")).read_bytes() for w in windows] == [lines[1], lines[0] + lines[2]]


def test_a_resume_in_a_chunk_of_normalised_text_continues_with_the_same_rows(tmp_path: Path) -> None:
    """The stand-in delimiter shortens a line and Latin-1 text lengthens it: the offsets a run resumes from are the
    file's, in chunks of a few lines."""
    folder = write_movielens_1m(tmp_path, num_users=6, per_user=8)
    data = ml1m_schema(folder)
    options: dict[str, Any] = {"batch_size": 3, "shuffle": True, "shuffle_buffer_size": 6, "seed": 3}
    options |= {"read_chunk_bytes": 100, "drop_last": False, "max_malformed_rows": 0}

    def reader() -> TabularReader:
        return TabularReader(str(folder / "ratings.dat"), data, **options)

    expected = [ids(b, "title") + ids(b, "userId") for step in reader() for b in step]
    interrupted = reader()
    head = [ids(b, "title") + ids(b, "userId") for _ in range(3) for b in next(interrupted)]
    resumed = reader()
    resumed.load_state_dict(interrupted.state_dict())

    assert head + [ids(b, "title") + ids(b, "userId") for step in resumed for b in step] == expected
    lines = (folder / "ratings.dat").read_text().splitlines()
    assert sum(len(row) for row in expected) == 2 * sum(int(line.split("::")[3]) < VALID_FROM for line in lines)


@pytest.mark.parametrize(
    ("valid_from", "test_from", "message"),
    [
        (
            1339227125.0,
            None,
            r"`dataset.split.valid_from` must leave rows to validate, but is 1339227125 \(2012-06-09\)",
        ),
        (956703932.0, None, r"`dataset.split.valid_from` must leave rows to train on, but is 956703932 \(2000-04-25\)"),
        (VALID_FROM, 2e9, r"`dataset.split.test_from` must leave rows to test, but is 2000000000 \(2033-05-18\)"),
    ],
)
def test_a_time_split_that_leaves_a_split_no_row_stops_at_start_up(
    tmp_path: Path, valid_from: float, test_from: float | None, message: str
) -> None:
    """ml-latest-small's cut (2012) on MovieLens-1M's ratings (2000-2003): the pass over every file that a history
    makes at start-up sees the split column's range."""
    folder = write_movielens_1m(tmp_path)
    history = DerivedColumn(name="movie_history", source="movieId", transform="history", key="userId", length=5)
    data = ml1m_schema(
        folder,
        derived=[history],
        categorical=[*ml1m_schema(folder).categorical, CategoricalColumns(columns=["movie_history"], multi_hot=True)],
        split=SplitByValue(column="timestamp", valid_from=valid_from, test_from=test_from),
    )
    values = TabularReader(str(folder / "ratings.dat"), data, split="all", batch_size=1).row_orders().split_values
    assert values is not None and values[0] < VALID_FROM <= values[1] < 1046454591

    if test_from is not None:
        data.split.refuse_empty_splits(values, scores_test=False)  # A test split that no one scores is not refused.
    with pytest.raises(ConfigError, match=message):
        data.split.refuse_empty_splits(values, scores_test=True)
