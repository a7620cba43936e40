"""``dataset.format``: a data format chosen by name, with its own options and checks, that the recipe asks for its
features and tables; the keys that were the section's own say where they went."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from recipes.cli.main import main
from recipes.config.resolution import ConfigError, resolve_config
from recsys.builtin.tabular.recipe import TabularConfig
from recsys.models.embeddings import TableSpec
from recsys.tabular.formats import DATA_FORMATS, DataFormatConfig
from recsys.tabular.formats.arrow import ArrowFormatConfig
from recsys.tabular.formats.data_format import ColumnFormat, data_format
from recsys.tabular.formats.delimited_text import CsvConfig, TsvConfig
from recsys.tabular.formats.libsvm import LibFFMConfig, LibSVMConfig
from recsys.tabular.schema import CategoricalColumns, TabularDataSection, with_full_keys


def dataset(*layers: dict[str, Any]) -> TabularDataSection:
    config = resolve_config(TabularConfig, [(f"layer {i}", {"dataset": layer}) for i, layer in enumerate(layers)])
    return config.dataset  # type: ignore[no-any-return]


def test_a_format_is_a_name_or_a_name_with_its_options() -> None:
    assert dataset({}).format == CsvConfig()
    assert dataset({"format": "parquet"}).format == ArrowFormatConfig("parquet")
    headerless = dataset({"format": {"name": "tsv", "header": False, "column_names": ["label", "I{1..2}"]}})
    assert headerless.format == TsvConfig(header=False, column_names=["label", "I1", "I2"])
    assert dataset({"format": {"name": "libffm", "num_fields": 10}}).format == LibFFMConfig(num_fields=10)


def test_csv_and_tsv_split_fields_by_their_own_delimiter_unless_told_otherwise() -> None:
    assert CsvConfig().field_delimiter == "," and TsvConfig().field_delimiter == "\t"
    assert TsvConfig(delimiter="|").field_delimiter == "|"
    # A layer that names another format keeps the options both take.
    switched = dataset({"format": {"name": "tsv", "header": False, "column_names": ["label"]}}, {"format": "csv"})
    assert switched.format == CsvConfig(header=False, column_names=["label"])


@pytest.mark.parametrize(
    ("layer", "message"),
    [
        ({"format": {"name": "parquet", "delimiter": ";"}}, r"^Unknown config key 'dataset.format.delimiter' for data "
         r"format 'parquet' \(from layer 0\). It is an option of csv, tsv.$"),
        ({"format": {"name": "csv", "num_fields": 3}}, r"'dataset.format.num_fields' for data format 'csv' .* libffm"),
        ({"format": "json"}, r"^`dataset.format.name` must be one of csv, libffm, libsvm, parquet, tsv, but is 'json'"),
        ({"format": {"name": "csv", "delimiter": ';"'}}, r"`delimiter` must not hold the quote character '\"'"),
        ({"format": {"name": "csv", "header": False}}, r"`column_names` must name the columns of files without a"),
        ({"format": "libffm"}, r"^Invalid config in 'dataset': `num_fields` must be set for `format: libffm`, but"),
        (
            {"format": "libsvm", "categorical": [{"columns": ["a"]}]},
            r"`format: libsvm` takes its features from the tokens: `dense`, `categorical`, `joins`, `derived` and "
            r"`split` must be empty, but are not.$",
        ),
        (
            {"format": "parquet", "categorical": [{"columns": ["a", "b"], "vocabulary": True}]},
            r"`vocabulary` must be false with `format: parquet` \(its values are hashed\), but is true for \['a', 'b'",
        ),
    ],
)  # fmt: skip
def test_a_format_refuses_what_it_cannot_read_in_one_line(layer: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        dataset(layer)


@pytest.mark.parametrize("key", ["delimiter", "quote_char", "header", "column_names", "num_fields"])
def test_a_key_that_moved_into_the_format_says_where_it_went(
    key: str, isolated_presets: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (isolated_presets / "old.yaml").write_text("recipe: tabular\n")

    code = main(["show", "old.yaml", f"dataset.{key}=null"])

    assert code == 2
    assert capsys.readouterr().err.strip() == (
        f"error: Unknown config key 'dataset.{key}' (from the command line). Did you mean 'dataset.format.{key}'?"
    )


def test_a_column_format_has_a_feature_per_categorical_column_and_a_table_per_column_or_shared_group() -> None:
    data = TabularDataSection(
        categorical=[
            CategoricalColumns(columns=["city", "zip"], num_buckets=100),
            CategoricalColumns(columns=["genres", "tags"], separator="|", shared_table="words", num_buckets=50),
        ]
    )

    features = data_format(data)

    assert isinstance(features, ColumnFormat)
    assert features.sparse_features() == ["city", "zip", "genres", "tags"]
    assert features.tables() == [
        TableSpec("city", 100, ("city",)),
        TableSpec("zip", 100, ("zip",)),
        TableSpec("words", 50, ("genres", "tags"), "mean"),
    ]


@pytest.mark.parametrize(
    ("tokens", "features"),
    [(LibSVMConfig(num_buckets=20), ["features"]), (LibFFMConfig(num_fields=2, num_buckets=20), ["field0", "field1"])],
)
def test_libsvm_brings_a_weighted_feature_per_field_and_keeps_full_keys_for_hash_tables(
    tokens: LibSVMConfig, features: list[str]
) -> None:
    data = TabularDataSection(format=tokens)

    assert not isinstance(data_format(data), ColumnFormat)
    assert data_format(data).sparse_features() == features
    assert data_format(data).tables() == [TableSpec(name, 20, (name,)) for name in features]
    assert with_full_keys(data).format == dataclasses.replace(tokens, num_buckets=0)


def test_a_schema_of_another_format_is_refused_by_a_reader_and_a_format_must_be_a_data_format_class(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(DATA_FORMATS, "_components", dict(DATA_FORMATS._components))
    DATA_FORMATS.register("function")(lambda schema: schema)

    with pytest.raises(TypeError, match=r"`format` must be configured by a LibSVMConfig, but is CsvConfig\(name='csv'"):
        TabularDataSection().format_options(LibSVMConfig)
    with pytest.raises(LookupError, match=r"'function' must be registered as a DataFormat subclass, but is <function"):
        data_format(TabularDataSection(format=DataFormatConfig("function")))


def test_column_names_that_lack_a_column_the_schema_reads_are_refused_before_any_file_is_opened() -> None:
    headerless = {"name": "tsv", "header": False}
    schema = {"label": {"column": "label"}, "categorical": [{"columns": ["C1", "C2"]}]}

    with pytest.raises(ConfigError, match=r"`format.column_names` must name every column the schema reads from the "
                       r"files, but lacks \['C2'\] \(it names \['label', 'C1'\]\)"):  # fmt: skip
        dataset({**schema, "format": {**headerless, "column_names": ["label", "C1"]}})
    # A column a join or a derived column adds is not the file's to name.
    derived = {"derived": [{"name": "C2", "source": "C1", "transform": "count"}]}
    assert (
        dataset({**schema, **derived, "format": {**headerless, "column_names": ["label", "C1"]}}).format.name == "tsv"
    )
