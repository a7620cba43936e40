"""The ``dataset`` schema of a tabular recipe: files, format, and what each column is.

Data is declared, not coded: a YAML schema names the files, their format and the role of each
column (the label, dense numbers, categorical values, multi-hot bags), and the reader turns rows
into click-prediction batches. Column lists accept brace ranges: ``"I{1..13}"`` stands for
``I1`` ... ``I13``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Annotated, Literal

from recipes.config import NonNegativeInt, PositiveInt, Range

FORMATS = ("csv", "tsv", "libsvm", "libffm", "parquet")
LIBSVM_FORMATS = ("libsvm", "libffm")
_RANGE = re.compile(r"^(.*)\{(\d+)\.\.(\d+)\}(.*)$")


def expand_names(names: list[str]) -> list[str]:
    """``["label", "I{1..3}"]`` -> ``["label", "I1", "I2", "I3"]``."""
    expanded = []
    for name in names:
        match = _RANGE.match(name)
        if match is None:
            expanded.append(name)
            continue
        prefix, first, last, suffix = match.groups()
        if int(first) > int(last):
            raise ValueError(f"A column range must count upwards, but '{name}' counts down instead.")
        expanded += [f"{prefix}{i}{suffix}" for i in range(int(first), int(last) + 1)]
    return expanded


@dataclass
class LabelColumn:
    column: str = "label"
    """The column holding the label."""
    positive: list[str] = field(default_factory=lambda: ["1"])
    """The values (as written in the file) that mean a click; ignored with ``threshold``."""
    negative: list[str] = field(default_factory=lambda: ["0"])
    """The values that mean no click; any other value is a malformed row (e.g. ``[-1]`` for -1/1 labels)."""
    threshold: Annotated[float, Range()] | None = None
    """Instead of values: a number >= ``threshold`` is a click (e.g. ``rating >= 4``)."""

    def __post_init__(self) -> None:
        overlap = set(self.positive) & set(self.negative)
        if self.threshold is None and overlap:
            raise ValueError(f"`positive` and `negative` must not share values, but share {sorted(overlap)}.")


@dataclass
class DenseColumns:
    columns: list[str] = field(default_factory=list)
    """Numeric columns, read as float32."""
    fill: Annotated[float, Range()] = 0.0
    """The value of an empty field."""
    log: bool = False
    """Take ``log(max(x, 0) + 1)``, as DLRM does for Criteo's counts."""

    def __post_init__(self) -> None:
        self.columns = expand_names(self.columns)


@dataclass
class CategoricalColumns:
    columns: list[str] = field(default_factory=list)
    """Categorical columns (integers or strings alike: the text of the field is what counts)."""
    num_buckets: Annotated[int, Range(ge=2)] = 1_000_000
    """Rows of each column's table: a value's id is 1 + its 64-bit hash modulo ``num_buckets - 1``;
    id 0 is an empty (missing) field's, which no value shares."""
    separator: str | None = None
    """Multi-hot: a field holds several values split by this (e.g. ``"|"`` for genres), pooled by mean."""
    shared_table: str | None = None
    """One table of this name for all the columns, instead of one each (their values still hash apart)."""
    vocabulary: bool = False
    """Instead of hashing: the ``num_buckets - 2`` most frequent values of the training files seen at least
    ``min_count`` times get ids of their own (from 2, by falling count), any other value the
    out-of-vocabulary id 1. Counted in one pass at the first start, saved in the output directory."""
    min_count: PositiveInt = 1
    """With ``vocabulary``: how often a value must occur in the training files to get an id of its own."""

    def __post_init__(self) -> None:
        self.columns = expand_names(self.columns)
        if self.min_count > 1 and not self.vocabulary:
            raise ValueError(f"`min_count` applies with `vocabulary: true` only, but is {self.min_count} without it.")
        if self.vocabulary and self.shared_table is not None:
            raise ValueError("`vocabulary` and `shared_table` must not be combined, but are both set.")
        if self.separator == "":
            raise ValueError("`separator` must be a non-empty string or null, but is '' instead.")


@dataclass
class TabularDataSection:
    train_path: str | None = None
    """Training files: an fsspec path or glob (local, memory://, s3://...), plain or gzip."""
    valid_path: str | None = None
    test_path: str | None = None
    """Optional: the ``test`` split of ``eval`` and ``predict``."""
    format: Literal["csv", "tsv", "libsvm", "libffm", "parquet"] = "csv"
    """``csv`` (``delimiter``, default ``,``), ``tsv`` (tab), ``libsvm`` (also libFM: ``label idx:val ...``),
    ``libffm`` (``label field:idx:val ...``) or ``parquet`` (typed columns named by the file, so ``delimiter``,
    ``quote_char``, ``header`` and ``column_names`` do not apply; a list column can be a multi-hot bag)."""
    delimiter: str | None = None
    """The field separator; ``null``: the format's."""
    quote_char: str | None = '"'
    """Fields may be quoted with this (``null``: no quoting); a quoted field must not hold a newline."""
    header: bool = True
    """Whether each file's first line names the columns."""
    column_names: list[str] | None = None
    """The columns' names in file order, for files without a header (brace ranges allowed)."""
    label: LabelColumn = field(default_factory=LabelColumn)
    dense: list[DenseColumns] = field(default_factory=list)
    categorical: list[CategoricalColumns] = field(default_factory=list)
    num_fields: PositiveInt | None = None
    """libSVM: the k-th token of a line is field k (``field0``...), at most this many (one-hot data such as
    Frappe's); ``null``: one bag ``features`` of all tokens. libFFM: the number of fields (required)."""
    libsvm_buckets: Annotated[int, Range(ge=2)] = 1_000_000
    """libSVM/libFFM: rows of each field's table (an ``idx`` is hashed like a categorical value)."""
    batch_size: PositiveInt = 1024
    """The global batch size of a micro-batch, split evenly over the data-parallel ranks."""
    shuffle_buffer_size: PositiveInt = 65_536
    """Rows shuffled together (a bounded window: memory does not grow with the files)."""
    max_malformed_rows: NonNegativeInt = 100
    """Malformed rows skipped (each logged with file and line) before the run stops with an error."""

    def __post_init__(self) -> None:
        if self.column_names is not None:
            self.column_names = expand_names(self.column_names)
        if not self.header and self.column_names is None and self.format not in (*LIBSVM_FORMATS, "parquet"):
            raise ValueError("`column_names` must name the columns of files without a header, but is not set.")
        if self.delimiter is not None and len(self.delimiter) != 1:
            raise ValueError(f"`delimiter` must be one character, but is {self.delimiter!r} instead.")
        if self.format == "libffm" and self.num_fields is None:
            raise ValueError("`num_fields` must be set for `format: libffm`, but is not.")
        if self.format in LIBSVM_FORMATS:
            if self.dense or self.categorical:
                raise ValueError(
                    f"`format: {self.format}` takes its features from the tokens: `dense` and "
                    "`categorical` must be empty, but are not."
                )
            return
        used = [self.label.column, *self.dense_columns, *self.categorical_columns]
        repeated = sorted({name for name in used if used.count(name) > 1})
        if repeated:
            raise ValueError(f"A column must have one role, but {repeated} have several.")

    @property
    def field_delimiter(self) -> str:
        return self.delimiter or ("\t" if self.format == "tsv" else ",")

    @property
    def sparse_features(self) -> list[str]:
        """The names of the batches' sparse features, in order."""
        if self.format in LIBSVM_FORMATS:
            return [f"field{k}" for k in range(self.num_fields)] if self.num_fields else ["features"]
        return self.categorical_columns

    @property
    def dense_columns(self) -> list[str]:
        return [name for group in self.dense for name in group.columns]

    @property
    def categorical_columns(self) -> list[str]:
        return [name for group in self.categorical for name in group.columns]
