"""The schema-driven tabular reader: CSV/TSV quirks, stable hashing, roles of columns, bad rows with file:line."""

from __future__ import annotations

import csv
import gzip
import logging
import random
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from recipes.training.data_reader import DataError
from recsys.tabular.formats.delimited_text import CsvConfig, TabularReader, TsvConfig
from recsys.tabular.hashing import hash_value
from recsys.tabular.labels import LabelColumn
from recsys.tabular.schema import CategoricalColumns, DenseColumns, TabularDataSection, expand_names


def schema(**overrides: object) -> TabularDataSection:
    values: dict[str, object] = {
        "label": LabelColumn(column="click"),
        "dense": [DenseColumns(columns=["age"])],
        "categorical": [CategoricalColumns(columns=["city"], num_buckets=1000)],
    }
    values.update(overrides)
    return TabularDataSection(**values)  # type: ignore[arg-type]


def read(path: Path | str, data: TabularDataSection, **kwargs: object) -> list[object]:
    options: dict[str, object] = {"batch_size": 1, "shuffle": False, "drop_last": False, "max_malformed_rows": 0}
    options.update(kwargs)
    return [batch for step in TabularReader(str(path), data, **options) for batch in step]  # type: ignore[arg-type]


def test_brace_ranges_expand_in_order() -> None:
    assert expand_names(["label", "I{1..3}", "x{9..10}y"]) == ["label", "I1", "I2", "I3", "x9y", "x10y"]


def test_crlf_quoted_fields_and_a_missing_value(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_bytes(b'click,age,city\r\n1,3.5,"Lyon, FR"\r\n0,,Rome\r\n1,2,\r\n')

    batches = read(path, schema())

    assert [b.labels.tolist() for b in batches] == [[1.0], [0.0], [1.0]]  # type: ignore[attr-defined]
    assert [b.dense.tolist() for b in batches] == [[[3.5]], [[0.0]], [[2.0]]]  # type: ignore[attr-defined]
    cities = [b.sparse["city"].ids.tolist() for b in batches]  # type: ignore[attr-defined]
    assert cities == [[hash_value("Lyon, FR", "city", 1000)], [hash_value("Rome", "city", 1000)], [0]]
    assert 0 not in cities[0] + cities[1]  # a real value never gets the missing value's id


def test_gzip_and_a_headerless_tsv_with_given_names(tmp_path: Path) -> None:
    path = tmp_path / "day.tsv.gz"
    with gzip.open(path, "wb") as file:
        file.write(b"1\t5\tab\n0\t\tcd\n")
    data = schema(format=TsvConfig(header=False, column_names=["click", "age", "city"], quote_char=None))

    batches = read(path, data)

    assert [b.labels.item() for b in batches] == [1.0, 0.0]  # type: ignore[attr-defined]
    assert [b.sparse["city"].ids.item() for b in batches] == [  # type: ignore[attr-defined]
        hash_value("ab", "city", 1000),
        hash_value("cd", "city", 1000),
    ]


def test_log_transform_label_mapping_threshold_and_multi_hot(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text("rating,age,genres\n4.5,1,a|b\n2,-3,\n")
    data = schema(
        label=LabelColumn(column="rating", threshold=4.0),
        dense=[DenseColumns(columns=["age"], log=True)],
        categorical=[CategoricalColumns(columns=["genres"], separator="|", num_buckets=50)],
    )

    first, second = read(path, data)

    assert first.labels.tolist() == [1.0] and second.labels.tolist() == [0.0]  # type: ignore[attr-defined]
    assert first.dense.tolist() == [[pytest.approx(float(torch.log(torch.tensor(2.0))))]]  # type: ignore[attr-defined]
    assert second.dense.tolist() == [[0.0]]  # type: ignore[attr-defined]
    genres = first.sparse["genres"]  # type: ignore[attr-defined]
    assert genres.ids.tolist() == [hash_value("a", "genres", 50), hash_value("b", "genres", 50)]
    assert genres.offsets.tolist() == [0, 2]
    assert second.sparse["genres"].ids.tolist() == [0]  # type: ignore[attr-defined]


def test_minus_one_one_labels_map_to_zero_one(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text("click,age,city\n-1,1,a\n1,1,b\n")

    batches = read(path, schema(label=LabelColumn(column="click", positive=["1"], negative=["-1"])))

    assert [b.labels.item() for b in batches] == [0.0, 1.0]  # type: ignore[attr-defined]


def test_the_same_value_gets_the_same_id_in_every_column_run_and_rank(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text("click,age,city\n" + "".join(f"{i % 2},1,city{i % 5}\n" for i in range(8)))

    one_rank = read(path, schema(), batch_size=2)
    two_ranks = [read(path, schema(), batch_size=1, dp_rank=rank, dp_size=2) for rank in range(2)]

    ids_one = [i for b in one_rank for i in b.sparse["city"].ids.tolist()]  # type: ignore[attr-defined]
    ids_two = [i for pair in zip(*two_ranks) for b in pair for i in b.sparse["city"].ids.tolist()]  # type: ignore[attr-defined]
    assert ids_one == ids_two == [hash_value(f"city{i % 5}", "city", 1000) for i in range(8)]
    assert hash_value("city1", "city", 1000) != hash_value("city1", "other", 1000)


def documented_hash_id(text: str, column: str, num_buckets: int) -> int:
    """The formula of recsys.tabular.hashing, in plain Python: what another tool can reproduce."""
    mask = (1 << 64) - 1
    state = 0xCBF29CE484222325
    for byte in column.encode() + b"\x1f" + text.encode():
        state = ((state ^ byte) * 0x100000001B3) & mask
    state = ((state ^ (state >> 30)) * 0xBF58476D1CE4E5B9) & mask
    state = ((state ^ (state >> 27)) * 0x94D049BB133111EB) & mask
    state ^= state >> 31
    return 1 + state % (num_buckets - 1)


@pytest.mark.parametrize("text", ["a", "Paris", "0", "68fd1e64", "é"])
def test_ids_follow_the_documented_hash(text: str) -> None:
    assert hash_value(text, "C1", 1_000_003) == documented_hash_id(text, "C1", 1_000_003)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (
            "click,age,city\n1,1,a\n1,2\n",
            "line 3 of file://{path} is malformed: it must have 3 fields, but has 2 instead",
        ),
        (
            "click,age,city\n1,abc,a\n",
            "line 2 of file://{path} is malformed: `age` must be a finite number or empty, but is 'abc'",
        ),
        (
            "click,age,city\n1,inf,a\n",
            "line 2 of file://{path} is malformed: `age` must be a finite number or empty, but is 'inf'",
        ),
        (
            "click,age,city\n7,1,a\n",
            "line 2 of file://{path} is malformed: the label `click` must be one of '1', '0', but is '7'",
        ),
    ],
)
def test_a_bad_row_names_its_file_and_line(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "rows.csv"
    path.write_text(text)

    with pytest.raises(DataError) as error:
        read(path, schema())

    assert fragment.format(path=path) in str(error.value).replace("Line", "line")


def test_bad_rows_up_to_the_limit_are_skipped_and_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "rows.csv"
    path.write_text("click,age,city\n1,1,a\n1,x,b\n0,2,c\n")

    with caplog.at_level(logging.WARNING):
        batches = read(path, schema(), max_malformed_rows=1)

    assert [b.labels.item() for b in batches] == [1.0, 0.0]  # type: ignore[attr-defined]
    assert "Skipping line 3" in caplog.text


def test_an_unknown_schema_column_is_an_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text("click,age,town\n1,1,a\n")

    with pytest.raises(
        DataError,
        match=r"A column of the schema must be a column of .*rows.csv or one the schema adds before it, but 'city'",
    ):
        read(path, schema())


def test_a_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"does not exist|matches none"):
        read(tmp_path / "nope.csv", schema())


def test_the_first_rows_of_a_file_are_checked_up_front(tmp_path: Path) -> None:
    path = tmp_path / "rows.tsv"
    path.write_text("click\tage\tcity\n1\t1\ta\n")  # a TSV read as CSV: one field per line

    reader = TabularReader(
        str(path), schema(format=CsvConfig(header=False, column_names=["click", "age", "city"])), batch_size=1
    )

    with pytest.raises(DataError, match=r"Line 1 of .*rows.tsv does not fit the schema: it must have 3 fields"):
        reader.check_first_rows()


def test_resume_mid_epoch_continues_with_the_same_rows(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text("click,age,city\n" + "".join(f"{i % 2},{i},c{i}\n" for i in range(50)))
    options: dict[str, object] = {"batch_size": 4, "shuffle": True, "shuffle_buffer_size": 16, "seed": 3}

    def reader() -> TabularReader:
        return TabularReader(str(path), schema(), **options)  # type: ignore[arg-type]

    expected = [b.dense.tolist() for step in reader() for b in step]  # type: ignore[attr-defined]
    interrupted = reader()
    head = [b.dense.tolist() for _ in range(3) for b in next(interrupted)]
    resumed = reader()
    resumed.load_state_dict(interrupted.state_dict())

    assert head + [b.dense.tolist() for step in resumed for b in step] == expected


def random_rows(seed: int, num_rows: int) -> list[list[str]]:
    """Rows of (click, amount, city, tags) text in the shapes real files hold: padded, quoted, empty, signed,
    with exponents, commas, doubled quotes and non-ASCII text."""
    rng = random.Random(seed)
    numbers = ["0", "-7", "+3", "12.5", ".25", "3.", "1e3", "-2.5E-2", "007", " 42 ", "", "123456789012345", "6.02e23"]
    words = ["Paris", "São Paulo", "a, b", 'say "hi"', " padded ", "", "x" * 40, "0", "é"]
    return [
        [
            rng.choice(["0", "1", " 1"]),
            rng.choice(numbers),
            rng.choice(words),
            "|".join(rng.choice(words[:4]) for _ in range(rng.randrange(1, 4))),
        ]
        for _ in range(num_rows)
    ]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_values_are_read_as_the_csv_module_and_float_read_them(tmp_path: Path, seed: int) -> None:
    rows = random_rows(seed, 300)
    path = tmp_path / "rows.csv"
    with path.open("w", newline="") as file:
        writer = csv.writer(file, lineterminator=random.Random(seed).choice(["\n", "\r\n"]))
        writer.writerow(["click", "amount", "city", "tags"])
        writer.writerows(rows)
    data = schema(
        dense=[DenseColumns(columns=["amount"], fill=-1.0)],
        categorical=[
            CategoricalColumns(columns=["city"], num_buckets=10_007),
            CategoricalColumns(columns=["tags"], num_buckets=10_007, separator="|"),
        ],
    )

    batch = read(path, data, batch_size=len(rows))[0]

    expected_dense = [float(a) if a.strip() else -1.0 for _, a, _, _ in rows]
    assert batch.dense[:, 0].tolist() == torch.tensor(expected_dense, dtype=torch.float32).tolist()  # type: ignore[attr-defined]
    assert batch.labels.tolist() == [float(c.strip()) for c, _, _, _ in rows]  # type: ignore[attr-defined]
    expected_cities = [hash_value(city.strip(), "city", 10_007) for _, _, city, _ in rows]
    assert batch.sparse["city"].ids.tolist() == expected_cities  # type: ignore[attr-defined]
    expected_tags = [hash_value(t.strip(), "tags", 10_007) for _, _, _, tags in rows for t in tags.split("|")]
    assert batch.sparse["tags"].ids.tolist() == expected_tags  # type: ignore[attr-defined]


def test_a_line_cut_wrong_is_reported_before_its_values(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text('click,age,city\n1,1,"open\n7,x\n1,1,a,\n')

    with pytest.raises(DataError) as error:
        read(path, schema(), max_malformed_rows=2)

    message = str(error.value)
    assert "Line 4 of" in message and "it must have 3 fields, but has 4 instead" in message  # a trailing delimiter


def test_an_unterminated_quote_and_a_bad_label_with_the_wrong_field_count(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text('click,age,city\n1,1,"open\n')

    with pytest.raises(DataError, match=r"Line 2 of .*a quoted field must end with a quote"):
        read(path, schema())

    path.write_text("click,age,city\n7,x\n")
    with pytest.raises(DataError, match=r"Line 2 of .*it must have 3 fields, but has 2 instead"):
        read(path, schema())


def test_a_byte_order_mark_before_the_header_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_bytes("\ufeffclick,age,city\n1,2,a\n".encode())

    assert [b.dense.tolist() for b in read(path, schema())] == [[[2.0]]]  # type: ignore[attr-defined]


def test_files_parsed_on_threads_give_the_same_batches(tmp_path: Path) -> None:
    paths = []
    for seed in (3, 4):  # two files, each with its header, the second gzip
        rows = random_rows(seed, 400)
        path = tmp_path / f"rows_{seed}.csv"
        with path.open("w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(["click", "amount", "city", "tags"])
            writer.writerows(rows)
        paths.append(str(path))
    with open(paths[1], "rb") as plain, gzip.open(paths[1] + ".gz", "wb") as packed:
        packed.write(plain.read())
    paths[1] += ".gz"
    data = schema(
        dense=[DenseColumns(columns=["amount"])],
        categorical=[
            CategoricalColumns(columns=["city"], num_buckets=1000),
            CategoricalColumns(columns=["tags"], num_buckets=1000, separator="|"),
        ],
    )

    def steps(threads: int) -> list[tuple[list[float], list[int], list[int]]]:
        reader = TabularReader(
            paths, data, batch_size=8, shuffle_buffer_size=64, seed=1, read_chunk_bytes=500, parse_threads=threads
        )
        return [
            (b.dense[:, 0].tolist(), b.sparse["city"].ids.tolist(), b.sparse["tags"].ids.tolist())
            for step in reader
            for b in step
        ]

    expected = steps(1)
    assert len(expected) == 100
    assert steps(2) == expected and steps(4) == expected


def test_a_header_naming_a_column_twice_stops_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text("click,age,city,age\n1,1,a,2\n")

    with pytest.raises(DataError) as error:
        read(path, schema())

    assert str(error.value) == f"The header of file://{path} must name each column once, but names age twice."


@pytest.mark.parametrize(
    ("text", "counts"),
    [
        ("click,age,city\n", "0 well-formed lines read this epoch, 0 malformed ones skipped"),  # a header alone
        ("click,age,city\n1,x,a\n0,y,b\n", "0 well-formed lines read this epoch, 2 malformed ones skipped"),
    ],
    ids=["header_alone", "every_row_skipped"],
)
def test_a_file_that_fills_no_step_is_described_by_its_name_rows_and_the_rows_of_a_step(
    tmp_path: Path, text: str, counts: str
) -> None:
    """What the Trainer says when the data fills no step (tests/unit/recipes/test_trainer.py); once the schema's
    run stopped with "is the data empty?", naming no file."""
    path = tmp_path / "rows.csv"
    path.write_text(text)
    reader = TabularReader(str(path), schema(), batch_size=4, shuffle=False, max_malformed_rows=5)

    assert [step for step in reader] == []

    assert reader.describe() == (
        f"file://{path}: {counts}; a step takes 4 rows (`batch_size` 4 per rank x 1 micro-batches "
        "(`trainer.grad_accumulation`) x 1 data-parallel ranks)"
    )


def cut_gzip(path: Path, rows: int) -> None:
    with gzip.open(path, "wb") as file:
        file.write(b"click,age,city\n" + b"".join(b"%d,%d,c%d\n" % (i % 2, i, i) for i in range(rows)))
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (
            lambda path: cut_gzip(path, 5000),
            "EOFError: Compressed file ended before the end-of-stream marker was reached",
        ),
        (lambda path: path.write_bytes(b"click,age,city\n1,2,a\n"), "BadGzipFile: Not a gzipped file (b'cl')"),
    ],
    ids=["cut_short", "not_a_gzip"],
)
def test_a_gzip_cut_short_or_not_a_gzip_is_one_line_naming_the_file(
    tmp_path: Path, make: Callable[[Path], None], reason: str
) -> None:
    """Once an EOFError or BadGzipFile traceback, exit 1, with no file named."""
    path = tmp_path / "rows.csv.gz"
    make(path)

    with pytest.raises(DataError) as error:
        read(path, schema(), batch_size=64)

    assert str(error.value) == (
        f"file://{path} must be a whole, valid compressed file, but reading it failed: {reason}."
    )
