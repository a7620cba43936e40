"""A data format from another package: ``tests/plugin_package``'s ``jsonl``, an ``ArrowReader`` in a few lines.

The package is not installed here: its module is imported from its folder, which registers the format by its
decorator, as the package's entry point would when a config first names ``jsonl``. The recipe then reads its
files as it reads Parquet files: the same rows and ids, resumed from any row, trained by ``python -m recipes``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tomllib

from recipes.config.resolution import ConfigError, resolve_config
from recsys.builtin.tabular.recipe import TabularConfig
from recsys.click.batch import CTRBatch
from recsys.tabular.formats import DATA_FORMATS
from recsys.tabular.formats.arrow import ArrowFormatConfig
from recsys.tabular.formats.data_format import data_format
from recsys.tabular.labels import LabelColumn
from recsys.tabular.schema import CategoricalColumns, DenseColumns, SplitByValue, TabularDataSection
from support.paths import PLUGIN_PACKAGE
from support.plugin_format import write_lines

ROWS = [
    {"click": 1, "age": 3, "score": 0.5, "city": "Lyon", "zip": 69001, "time": 10},
    {"click": -1, "score": 1.25, "city": "Rome", "zip": 12, "time": 20},
    {"click": 1, "age": 7, "city": None, "zip": 69001, "time": 30},
    {"click": -1, "age": -2, "score": 2.0, "city": "Lyon", "time": 40},
    {"click": 1, "age": 0, "score": -1.0, "city": "Oslo", "zip": 7, "time": 50},
]


def schema(name: str, **overrides: Any) -> TabularDataSection:
    values: dict[str, Any] = {
        "format": ArrowFormatConfig(name),
        "label": LabelColumn(column="click", positive=["1"], negative=["-1"]),
        "dense": [DenseColumns(columns=["age"], log=True), DenseColumns(columns=["score"], fill=-1.0)],
        "categorical": [CategoricalColumns(columns=["city", "zip"], num_buckets=1000)],
    }
    return TabularDataSection(**{**values, **overrides})


def read(path: str, data: TabularDataSection, split: str = "train", **options: Any) -> list[list[CTRBatch]]:
    """The steps of the recipe's reader of ``path``: the one that the schema's format makes."""
    options = {"batch_size": 1, "shuffle": False, "drop_last": False, "max_malformed_rows": 0, **options}
    return list(data_format(data).reader(path, split=split, encodings=None, **options))


def rows_of(steps: list[list[CTRBatch]]) -> list[tuple[Any, ...]]:
    """Every row's label, dense values and ids, in reading order."""
    return [
        (batch.labels[row].item(), batch.dense[row].tolist(), *(
            batch.sparse[name].ids[batch.sparse[name].offsets[row] : batch.sparse[name].offsets[row + 1]].tolist()
            for name in batch.sparse
        ))
        for step in steps
        for batch in step
        for row in range(batch.batch_size)
    ]  # fmt: skip


@pytest.mark.usefixtures("plugin")
def test_a_jsonl_file_gives_the_rows_and_ids_of_the_same_rows_in_parquet(tmp_path: Path) -> None:
    lines = write_lines(tmp_path / "rows.jsonl", ROWS)
    parquet = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), parquet)

    from_lines = rows_of(read(lines, schema("jsonl")))

    assert from_lines == rows_of(read(str(parquet), schema("parquet")))
    assert [row[0] for row in from_lines] == [1.0, 0.0, 1.0, 0.0, 1.0]
    assert from_lines[2][2] == [0]  # a missing city: the missing value's id


@pytest.mark.usefixtures("plugin")
def test_a_jsonl_split_by_value_keeps_its_rows_and_resumes_at_a_row(tmp_path: Path) -> None:
    lines = write_lines(tmp_path / "rows.jsonl", ROWS * 8)
    data = schema("jsonl", split=SplitByValue(column="time", valid_from=35))
    options = {"batch_size": 2, "shuffle": True, "shuffle_buffer_size": 4, "seed": 3}

    valid = rows_of(read(lines, data, "valid"))
    uninterrupted = data_format(data).reader(lines, split="train", encodings=None, **options)
    expected = rows_of(list(uninterrupted))
    interrupted = data_format(data).reader(lines, split="train", encodings=None, **options)
    head = rows_of([next(interrupted) for _ in range(5)])
    resumed = data_format(data).reader(lines, split="train", encodings=None, **options)
    resumed.load_state_dict(interrupted.state_dict())

    assert len(valid) == 16 and {row[0] for row in valid} == {0.0, 1.0}
    assert len(expected) == 24 and head + rows_of(list(resumed)) == expected


@pytest.mark.usefixtures("plugin")
def test_a_jsonl_config_takes_no_text_option_nor_a_vocabulary() -> None:
    def dataset(layer: dict[str, Any]) -> TabularDataSection:
        config = resolve_config(TabularConfig, [("the test", {"dataset": layer})])
        return config.dataset  # type: ignore[no-any-return]

    assert dataset({"format": "jsonl"}).format == ArrowFormatConfig("jsonl")
    with pytest.raises(ConfigError, match=r"^Unknown config key 'dataset.format.delimiter' for data format 'jsonl'"):
        dataset({"format": {"name": "jsonl", "delimiter": ";"}})
    with pytest.raises(ConfigError, match=r"`vocabulary` must be false with `format: jsonl` \(its values are hashed"):
        dataset({"format": "jsonl", "categorical": [{"columns": ["city"], "vocabulary": True}]})


@pytest.mark.usefixtures("plugin_folder")
def test_the_packages_entry_point_registers_jsonl_when_a_config_first_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    with open(PLUGIN_PACKAGE / "pyproject.toml", "rb") as file:
        declared = tomllib.load(file)["project"]["entry-points"][DATA_FORMATS.entry_point_group]
    points = [
        importlib.metadata.EntryPoint(name, value, DATA_FORMATS.entry_point_group) for name, value in declared.items()
    ]
    installed = importlib.metadata.entry_points

    def with_the_plugin(**selection: Any) -> Any:
        found = installed(**selection)
        return [*found, *points] if selection.get("group") == DATA_FORMATS.entry_point_group else found

    monkeypatch.setattr(importlib.metadata, "entry_points", with_the_plugin)

    assert "jsonl" in DATA_FORMATS.names() and "recipes_plugin.jsonl" not in sys.modules
    config = resolve_config(TabularConfig, [("the test", {"dataset": {"format": "jsonl"}})])

    assert type(data_format(config.dataset)).__module__ == "recipes_plugin.jsonl"  # type: ignore[attr-defined]
