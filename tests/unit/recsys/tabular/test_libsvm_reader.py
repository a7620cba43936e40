"""libSVM/libFM and libFFM lines: tokens to weighted sparse features, labels mapped, bad tokens with file:line."""

from __future__ import annotations

from pathlib import Path

import pytest

from recipes.training.data_reader import DataError
from recsys.tabular.formats.libsvm import LibFFMConfig, LibSVMConfig, LibSVMReader
from recsys.tabular.hashing import hash_value
from recsys.tabular.labels import LabelColumn
from recsys.tabular.schema import TabularDataSection

MINUS_ONE_ONE = LabelColumn(positive=["1"], negative=["-1"])


def read(path: Path, data: TabularDataSection, **kwargs: object) -> list[object]:
    options: dict[str, object] = {"batch_size": 1, "shuffle": False, "drop_last": False, "max_malformed_rows": 0}
    options.update(kwargs)
    return [batch for step in LibSVMReader(str(path), data, **options) for batch in step]  # type: ignore[arg-type]


def test_libfm_positional_fields_with_crlf_and_weights(tmp_path: Path) -> None:
    path = tmp_path / "frappe.libfm"
    path.write_bytes(b"1 3:1 17:1 40:0.5\r\n-1 2:1 18:1 41:1\n")
    data = TabularDataSection(format=LibSVMConfig(num_fields=3, num_buckets=100), label=MINUS_ONE_ONE)

    first, second = read(path, data)

    assert first.labels.tolist() == [1.0] and second.labels.tolist() == [0.0]  # type: ignore[attr-defined]
    assert list(first.sparse) == ["field0", "field1", "field2"]  # type: ignore[attr-defined]
    assert first.sparse["field0"].ids.tolist() == [hash_value("3", "field0", 100)]  # type: ignore[attr-defined]
    assert first.sparse["field2"].weights.tolist() == [0.5]  # type: ignore[attr-defined]
    assert first.dense.shape == (1, 0)  # type: ignore[attr-defined]


def test_libsvm_without_fields_is_one_weighted_bag(tmp_path: Path) -> None:
    path = tmp_path / "a.svm"
    path.write_text("1 5:0.25 9:2\n0\n")
    data = TabularDataSection(format=LibSVMConfig(num_buckets=100))

    first, second = read(path, data)

    bag = first.sparse["features"]  # type: ignore[attr-defined]
    assert bag.ids.tolist() == [hash_value("5", "features", 100), hash_value("9", "features", 100)]
    assert bag.weights.tolist() == [0.25, 2.0] and bag.offsets.tolist() == [0, 2]
    assert second.sparse["features"].offsets.tolist() == [0, 0]  # a line with no token: an empty bag  # type: ignore[attr-defined]


def test_libffm_fields_come_from_the_tokens(tmp_path: Path) -> None:
    path = tmp_path / "a.ffm"
    path.write_text("1 0:5:1 2:9:1\n")
    data = TabularDataSection(format=LibFFMConfig(num_fields=3, num_buckets=100))

    (batch,) = read(path, data)

    sparse = batch.sparse  # type: ignore[attr-defined]
    assert sparse["field0"].ids.tolist() == [hash_value("5", "field0", 100)]
    assert sparse["field1"].ids.tolist() == [] and sparse["field1"].offsets.tolist() == [0, 0]
    assert sparse["field2"].ids.tolist() == [hash_value("9", "field2", 100)]


@pytest.mark.parametrize(
    ("line", "tokens", "problem"),
    [
        ("1 3 4:1", LibSVMConfig(num_fields=3), "every feature token must look like idx:val"),
        ("1 3:x", LibSVMConfig(num_fields=3), "every feature's value must be a finite number"),
        ("1 3:inf", LibSVMConfig(num_fields=3), "every feature's value must be a finite number"),
        ("1 1:1 2:1 3:1 4:1", LibSVMConfig(num_fields=3), "it must have at most 3 feature tokens"),
        ("2 1:1 2:1 3:1", LibSVMConfig(num_fields=3), "the label must be one of 1, -1, but is 2 instead"),
        ("1 1:1 2:1", LibSVMConfig(num_fields=3), "it must have 3 feature tokens, one per field"),
        ("abc 3:1", LibSVMConfig(num_fields=3), "it must start with a numeric label"),
        ("1 7:5:1", LibFFMConfig(num_fields=3), "every field must be an integer in [0, 3)"),
    ],
)
def test_a_bad_line_names_its_file_and_line(tmp_path: Path, line: str, tokens: LibSVMConfig, problem: str) -> None:
    path = tmp_path / "bad.libfm"
    good = "1 0:1:1" if tokens.with_fields else "1 1:1 2:1 3:1"
    path.write_text(f"{good}\n{line}\n")
    schema = TabularDataSection(format=tokens, label=MINUS_ONE_ONE)

    with pytest.raises(DataError) as error:
        read(path, schema)

    assert f"Line 2 of file://{path} is malformed: {problem}" in str(error.value)


def test_libffm_lines_that_leave_fields_out_read_them_as_empty_bags_and_say_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "sparse.ffm"
    path.write_text("1 0:5:1 1:6:1 2:7:1\n1 0:5:1\n")
    data = TabularDataSection(format=LibFFMConfig(num_fields=3, num_buckets=100))

    _, second = read(path, data)

    assert second.sparse["field2"].ids.tolist() == []  # type: ignore[attr-defined]
    assert "1 lines of a chunk of" in caplog.text and "fewer than the 3 fields of `num_fields`" in caplog.text
