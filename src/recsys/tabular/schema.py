"""The ``dataset`` schema of a tabular recipe: files, format, and what each column is.

Data is declared, not coded: a YAML schema names the files, their format and the role of each
column (the label, dense numbers, categorical values, multi-hot bags), and the reader turns rows
into click-prediction batches. Column lists accept brace ranges: ``"I{1..13}"`` stands for
``I1`` ... ``I13``.

The format is a component chosen by name from ``DATA_FORMATS`` (``format: parquet``, or
``format: {name: csv, delimiter: ";"}``), each with its own options; ``recsys.tabular.formats``
holds the registry, says what a format is, and has a module per built-in format.

Besides a file's own columns, a role may name a column of a side table joined by key (the genres
of a movie, from ``movies.csv``) or a column derived from another (the hour of a timestamp, the
number of training rows holding a value); ``split`` cuts the rows of one file into training,
validation and test rows by the value of a column (a time split).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from importlib.resources import files
from typing import Annotated, Literal, TypeVar

from recipes import GlobalBatchSize, NonNegativeInt, PositiveInt, Range
from recsys.click.tasks import Task
from recsys.tabular.formats.format_config import DATA_FORMATS, DataFormatConfig
from recsys.tabular.labels import LabelColumn, LabelTask, check_label_tasks
from recsys.tabular.split_by_value import SplitByValue as SplitByValue  # Re-exported: part of the schema.

TIME_PARTS = ("hour", "weekday", "day", "month", "year")
COUNTS = ("count", "count_before")
HISTORY = "history"
PACKAGE_SCHEME = "package://"
DEFAULT_NUM_BUCKETS = 1_000_000
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


def resolve_path(path: str) -> str:
    """``path``, or for ``package://PACKAGE/RELATIVE`` the file of that name in the installed package ``PACKAGE``:
    data shipped with a package (a built-in preset's) is found wherever the package is installed, and a run's
    config keeps the portable name, so that it resumes from another install."""
    if not path.startswith(PACKAGE_SCHEME):
        return path
    package, _, relative = path.removeprefix(PACKAGE_SCHEME).partition("/")
    try:
        root = files(package)
    except ModuleNotFoundError:
        raise ValueError(f"The package of {path} must be installed, but '{package}' is not.") from None
    return str(root.joinpath(relative))


def in_folder(folder: str, path: str | None) -> str | None:
    """``path`` in ``folder`` if it is relative (no URL, no ``package://``, not absolute), else as it is."""
    if path is None or "://" in path or os.path.isabs(os.path.expanduser(path)):
        return path
    return f"{folder}/{path}"


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
    num_buckets: Annotated[int, Range(ge=2)] = DEFAULT_NUM_BUCKETS
    """Rows of each column's table: a value's id is 1 + its 64-bit hash modulo ``num_buckets - 1``;
    id 0 is an empty (missing) field's, which no value shares."""
    separator: str | None = None
    """Multi-hot: a field holds several values split by this (e.g. ``"|"`` for genres), pooled by mean."""
    multi_hot: bool = False
    """A bag of values per row, pooled by mean: implied by ``separator``; needed for a joined column whose key
    has several rows in its side table (the tags of a movie)."""
    shared_table: str | None = None
    """One table of this name for all the columns, instead of one each (their values still hash apart)."""
    vocabulary: bool = False
    """Instead of hashing: the ``num_buckets - 2`` most frequent values of the training files seen at least
    ``min_count`` times get ids of their own (from 2, by falling count), any other value the
    out-of-vocabulary id 1. Counted in one pass at the first start, saved in the output directory."""
    min_count: PositiveInt = 1
    """With ``vocabulary``: how often a value must occur in the training files to get an id of its own."""
    sequence: bool = False
    """Each field is a sequence of values in time order, the oldest first (the movies a user watched, a ``history``
    column): a bag whose order counts, for the models that read sequences (``din``). Its table is not pooled: the
    model receives every id's vector with the row offsets (jagged, no padding), and pads where it needs to. Implies
    ``multi_hot``; needs ``max_len``."""
    max_len: PositiveInt | None = None
    """With ``sequence``: the most values a row keeps, its latest ones (the end of the field), which bounds what a
    step computes; longer fields are cut."""
    same_ids_as: str | None = None
    """The name of another categorical column whose values these are too (the movies of a sequence, and the
    candidate ``movie_id``): the values hash as that column's do and look up its table, so that a value has one
    row for both. The group then takes the table of that column (its ``num_buckets``, its ``shared_table``)."""

    def __post_init__(self) -> None:
        self.columns = expand_names(self.columns)
        if self.sequence and self.max_len is None:
            raise ValueError(f"`max_len` must be set for the sequence group {self.columns}, but is not.")
        if self.max_len is not None and not self.sequence:
            raise ValueError(f"`max_len` applies to a group with `sequence: true`, but {self.columns} is not one.")
        if self.same_ids_as is not None and (self.vocabulary or self.shared_table is not None):
            raise ValueError(
                f"A group with `same_ids_as` takes the table of '{self.same_ids_as}', so `vocabulary` and "
                f"`shared_table` must not be set, but {self.columns} sets one."
            )
        if self.min_count > 1 and not self.vocabulary:
            raise ValueError(f"`min_count` applies with `vocabulary: true` only, but is {self.min_count} without it.")
        if self.vocabulary and self.shared_table is not None:
            raise ValueError("`vocabulary` and `shared_table` must not be combined, but are both set.")
        if self.separator == "":
            raise ValueError("`separator` must be a non-empty string or null, but is '' instead.")
        self.multi_hot = self.multi_hot or self.separator is not None or self.sequence


@dataclass
class WindowsSection:
    """The training data as a sequence of time windows, trained on one after the other
    (``recsys.tabular.window_sources``)."""

    by: Literal["none", "path", "column"] = "none"
    """``path``: ``train_path`` is a glob whose files (or folders) carry a time in their paths
    (``logs/*/hour=*/*.parquet``), those of one time forming a window; ``column``: the rows of ``train_path``
    in consecutive ranges of ``column``'s values, ``every`` long; ``none``: no windows."""
    column: str | None = None
    """``by: column``: the time column (seconds since 1970); ``null``: ``split.column``."""
    every: str = "1d"
    """``by: column``: a window's length: a number and ``d``, ``h``, ``m`` or ``s`` (``1d``, ``6h``); windows
    start at multiples of it since 1970 (UTC days), or since ``start``."""
    start: Annotated[float, Range()] | None = None
    """``by: column``: the first window starts here; the rows before it form one window before it, named
    ``before-<time>``: the history a model learns from before it goes online. ``null``: no such window."""
    done_file: str | None = None
    """``by: path``: a window is there once every folder of its files holds this file (``_SUCCESS``); ``null``:
    once its files are. Files whose names start with ``_`` or ``.`` are never data."""
    poll_interval_s: Annotated[float, Range(gt=0)] = 10.0
    """With ``follow``: how often to look for the next window while waiting."""


@dataclass
class JoinedTable:
    """A side table whose columns join the rows by key: the attributes of an item or a user.

    It is read whole at start-up (meant for tables of items or users, not logs): a CSV/TSV file with a header
    (tab-separated if its name ends in ``.tsv`` or ``.tsv.gz``) or a Parquet file (``.parquet``), through fsspec;
    a text file of other options (MovieLens-1M's ``movies.dat``) says them in ``format``.
    Keys match by their text, as categorical values do. A row whose key the table lacks gets missing values
    (categorical id 0, a dense ``fill``). A key may have several rows: its values of a column then form a bag,
    which a categorical group takes with ``multi_hot: true``. When the table holds the ``split`` column, only
    its rows of the training range are read, so that no later information leaks into the features.
    """

    path: str = ""
    """An fsspec path (``package://PACKAGE/...`` for a file shipped in an installed package)."""
    key: str = ""
    """The side table's key column."""
    on: str | None = None
    """The rows' column that holds the key; ``null``: the column named like ``key``."""
    columns: list[str] = field(default_factory=list)
    """The side table's columns that the rows take, by their names (which must be new to the rows)."""
    format: Annotated[DataFormatConfig, DATA_FORMATS] | None = None
    """The file's format and options, as ``dataset.format``'s (``csv`` or ``tsv``: ``delimiter``, ``header``,
    ``column_names``, ``encoding``...); ``null``: by the name's extension, as above."""

    def __post_init__(self) -> None:
        if not self.path or not self.key or not self.columns:
            raise ValueError(
                f"A join must name its `path`, `key` and `columns`, but has path={self.path!r}, key={self.key!r} and "
                f"columns={self.columns!r}."
            )
        if self.format is not None and not self.format.reads_side_tables:
            raise ValueError(
                f"A join's `format` must be one that reads a whole side table (csv, tsv; null for Parquet), but is "
                f"'{self.format.name}' instead."
            )
        self.columns = expand_names(self.columns)
        self.on = self.on or self.key


@dataclass
class DerivedColumn:
    """A column computed from another: a part of a unix timestamp (UTC), or a count over the training rows.

    ``hour`` (0-23), ``weekday`` (Monday is 0), ``day`` (of the month), ``month`` (1-12) and ``year`` read the
    source as seconds since 1970; ``count`` is the number of training rows holding the source's value (the
    popularity of an item, say); ``count_before`` the number of those that come before the row in the order of
    ``split.column`` (for a validation or test row of a split by time: all of them; under leave-one-out, where
    training rows of other keys may come later, only the earlier ones), so that a training row's feature holds
    nothing from its future, as a validation row's cannot: a user's first training rows count 0, 1, 2..., and a user
    first seen in validation counts 0 there, as every user's first training row does. Counts are taken in one
    pass at the first start and saved in the output directory (``count_before`` keeps one split value per
    training row). A derived column is a number: a dense group takes it as is, a categorical group takes its
    decimal text.

    ``history`` is a bag instead (a multi-hot categorical group takes it): the values of the source in the latest
    ``length`` rows of the row's ``key`` (the user) that come before it in the order of ``split.column`` (then of
    ``split.tie_break``, under leave-one-out with one: a test row's history holds its validation row), in every
    configured file (training, validation and test rows alike: a deployed model knows what a user did before a
    request, never how they rated it; no label is read). The source is a file column or a joined one (the genres
    of the movies a user rated before), and its values keep the source's keys, so that a ``shared_table`` with the
    source gives a value one row in both. Built at each start in one pass over the files (memory follows their
    rows).
    """

    name: str = ""
    """The new column's name, by which groups and slices name it."""
    source: str = ""
    """The column it is computed from: a file column, or a joined one."""
    transform: Literal["hour", "weekday", "day", "month", "year", "count", "count_before", "history"] = "hour"
    """What it computes: a part of a unix time (``hour``, ``weekday``, ``day``, ``month``, ``year``), ``count``,
    ``count_before`` or ``history``, as the class says."""
    key: str | None = None
    """``history``: the column whose earlier rows are gathered (the user)."""
    length: PositiveInt = 20
    """``history``: how many of those rows, the latest."""

    def __post_init__(self) -> None:
        if not self.name or not self.source:
            raise ValueError(
                f"A derived column must have a `name` and a `source`, but has {self.name!r} and {self.source!r}."
            )
        if (self.key is None) == (self.transform == HISTORY):
            raise ValueError(
                f"`key` must be set exactly for `transform: history`, but the derived column '{self.name}' has "
                f"transform {self.transform!r} and key {self.key!r}."
            )


FormatT = TypeVar("FormatT", bound=DataFormatConfig)


@dataclass
class TabularDataSection:
    """The ``tabular`` recipe's ``dataset``: your own CSV/TSV, libSVM/libFM/libFFM or Parquet files, declared by a
    schema of columns, no Python. At start-up the first 100 records of every configured file (train, valid, test)
    are parsed against it, so that a wrong format, delimiter or column stops the run in one line, with file and line
    number, before training; a bad row later is logged and skipped, up to ``max_malformed_rows``. A path
    ``package://PACKAGE/FILE`` names a file shipped inside an installed Python package."""

    train_path: str | None = None
    """Training files: an fsspec path or glob (local, memory://, s3://..., or ``package://PACKAGE/...`` for files
    shipped in an installed package), plain or gzip."""
    valid_path: str | None = None
    """Validation files, as ``train_path``."""
    test_path: str | None = None
    """Optional: the ``test`` split of ``eval`` and ``predict``."""
    data_dir: str | None = None
    """The folder of the relative paths above and of the joins' (a local folder or an fsspec URL); ``null``: the
    current directory. A preset for files of a known layout (``movielens_1m_din``: ``ratings.dat``, ``movies.dat``)
    names the files and leaves their folder to you. The paths are made absolute at start-up, and a run's config
    keeps them so."""
    format: Annotated[DataFormatConfig, DATA_FORMATS] = field(default_factory=DATA_FORMATS.default("csv"))
    """The files' format and its options: ``csv`` and ``tsv`` (``delimiter``, ``quote_char``, ``header``,
    ``column_names``), ``libsvm`` (also libFM: ``label idx:val ...``) and ``libffm`` (``label field:idx:val ...``;
    ``num_fields``, ``num_buckets``), ``parquet`` (typed columns named by the file; a list column can be a
    multi-hot bag), or one an installed package adds."""
    label: LabelColumn = field(default_factory=LabelColumn)
    """The one binary label (a click), unless ``labels`` names several tasks."""
    labels: list[LabelTask] | None = None
    """Several tasks, each a label column (binary or regression) with a loss ``weight``, for one model with an
    output per task (``mlp``, ``dcn_v2``, ``wide_deep``, ``dlrm``, ``deepfm``, ``din``, ``bst``, and the multi-task
    models ``mmoe``, ``ple``, ``esmm``); their metrics are named ``<task>/auc``, ``<task>/mse`` ... Two tasks may read
    one column (``rating >= 4`` and the rating). Replaces ``label``, which is then not read, so that a preset based on
    one with a ``label`` names its tasks instead. Not for the libSVM formats, whose label is the line's first token."""
    dense: list[DenseColumns] = field(default_factory=list)
    categorical: list[CategoricalColumns] = field(default_factory=list)
    joins: list[JoinedTable] = field(default_factory=list)
    """Side tables whose columns the rows take by key (a format that reads the schema's columns: CSV/TSV, Parquet)."""
    derived: list[DerivedColumn] = field(default_factory=list)
    """Columns computed from others (a format that reads the schema's columns)."""
    split: SplitByValue = field(default_factory=SplitByValue)
    batch_size: GlobalBatchSize = 1024
    """The global batch size of a micro-batch, split evenly over the data-parallel ranks."""
    shuffle_buffer_size: PositiveInt = 65_536
    """Rows shuffled together (a bounded window: memory does not grow with the files)."""
    max_malformed_rows: NonNegativeInt = 100
    """Malformed rows skipped (each logged with file and line) before the run stops with an error."""
    windows: WindowsSection = field(default_factory=WindowsSection)
    follow: bool = False
    """With ``windows.by: path``: at the last window, wait for the next to appear rather than end (online
    training); a SIGTERM while waiting stops the run, saved."""
    parse_threads: PositiveInt | None = None
    """Threads that parse the chunks after the one being batched, meanwhile: for a run whose reading is the
    bottleneck, on a machine with cores to spare (the rows and their order are the same). At most the cores this
    process may run on (checked at start-up: more would only wait for each other). By default 1 on a CPU, up to 4
    on a GPU (``recipes.parse_threads``)."""

    def __post_init__(self) -> None:
        if self.data_dir is not None:
            self._locate_in(self.data_dir)
        self.format.check(self)
        check_label_tasks(self.labels, self.added_columns)
        features = [*self.dense_columns, *self.categorical_columns]
        labelled = sorted({task.column for task in self.label_tasks} & set(features))
        if labelled:
            raise ValueError(f"A label column must not be a feature too, but {labelled} are both.")
        used = [*dict.fromkeys(task.column for task in self.label_tasks), *features]
        repeated = sorted({name for name in used if used.count(name) > 1})
        if repeated:
            raise ValueError(f"A column must have one role, but {repeated} have several.")
        ordered = [column.name for column in self.derived if column.transform in ("count_before", HISTORY)]
        if ordered and self.split.column is None:
            raise ValueError(
                f"`count_before` and `history` take the rows before a row in the order of `split.column`, which must "
                f"be set for {ordered}, but is not."
            )
        self._check_histories()
        self._check_same_ids()
        if self.split.last_of is not None and self.windows.by != "none":
            raise ValueError(
                f"Leave-one-out (`split.last_of`) keeps each key's earlier rows for training, which no window of time "
                f"holds, so `windows.by` must be `none`, but is `{self.windows.by}`."
            )
        if self.follow and self.windows.by != "path":
            raise ValueError(
                f"`follow` waits for new windows of files, so `windows.by` must be `path`, but is `{self.windows.by}`."
            )
        added = [*(name for join in self.joins for name in join.columns), *(column.name for column in self.derived)]
        twice = sorted({name for name in added if added.count(name) > 1})
        if twice:
            raise ValueError(f"A joined or derived column must have a name of its own, but {twice} are added twice.")

    def _locate_in(self, folder: str) -> None:
        """Every relative path of the files and joins, in ``folder``."""
        if not folder:
            raise ValueError("`data_dir` must name a folder or be null, but is empty.")
        base = folder.rstrip("/") if "://" in folder else os.path.abspath(os.path.expanduser(folder))
        self.train_path, self.valid_path, self.test_path = (
            in_folder(base, path) for path in (self.train_path, self.valid_path, self.test_path)
        )
        for join in self.joins:
            join.path = in_folder(base, join.path) or join.path

    def _check_histories(self) -> None:
        """A history is a bag of keys: a multi-hot group hashes it; a dense group or a vocabulary cannot take it."""
        groups = {name: group for group in self.categorical for name in group.columns}
        for column in self.derived:
            if column.transform != HISTORY:
                continue
            group = groups.get(column.name)
            if column.name in self.dense_columns or (group is not None and not group.multi_hot):
                raise ValueError(
                    f"The history '{column.name}' is a bag of values: a categorical group with `multi_hot: true` must "
                    "take it, but a dense or single-valued group does."
                )
            if group is not None and group.vocabulary:
                raise ValueError(
                    f"The history '{column.name}' keeps its source's keys, which a `vocabulary` cannot count: its "
                    "group must hash them, but has `vocabulary: true`."
                )

    def _check_same_ids(self) -> None:
        """A group of ``same_ids_as`` takes a hashed column's table: the column must be one, of a group of its own
        kind, and the table's features must pool one way (a sequence is not pooled, a multi-hot bag is)."""
        groups = self.groups_by_column
        for group in self.categorical:
            target = group.same_ids_as
            if target is None:
                continue
            if target not in groups or groups[target] is group:
                raise ValueError(
                    f"`same_ids_as` must name a categorical column of another group, but {group.columns} name "
                    f"'{target}' instead."
                )
            owner = groups[target]
            if owner.same_ids_as is not None or owner.vocabulary:
                why = "`same_ids_as` itself" if owner.same_ids_as is not None else "`vocabulary: true`"
                raise ValueError(
                    f"`same_ids_as` must name a column of hashed values with a table of its own, but '{target}' has "
                    f"{why}."
                )
            if group.num_buckets not in (owner.num_buckets, DEFAULT_NUM_BUCKETS):
                raise ValueError(
                    f"`num_buckets` of {group.columns} must be left out or equal that of '{target}' "
                    f"({owner.num_buckets}), whose table they look up, but is {group.num_buckets} instead."
                )
            group.num_buckets = owner.num_buckets
            sharing = [
                owner,
                *(g for g in self.categorical if g.same_ids_as is not None and groups.get(g.same_ids_as) is owner),
            ]
            bags = [g.columns for g in sharing if g.multi_hot and not g.sequence]
            if bags and any(g.sequence for g in sharing):
                raise ValueError(
                    f"A table is pooled one way, but the table of '{target}' is looked up by a sequence (not pooled) "
                    f"and by the multi-hot bag {bags[0]} (pooled by mean): make both sequences, or give them tables "
                    "of their own."
                )
        sources = {column.name: column.source for column in self.derived if column.transform == HISTORY}
        for name, source in sources.items():
            kind = groups[name].same_ids_as if name in groups else None
            if kind is not None and kind != self.id_kind(source):
                raise ValueError(
                    f"The history '{name}' keeps the keys of its source '{source}', so its `same_ids_as` must be "
                    f"'{self.id_kind(source)}', but is '{kind}' instead."
                )

    @property
    def groups_by_column(self) -> dict[str, CategoricalColumns]:
        """Each categorical column's group."""
        return {name: group for group in self.categorical for name in group.columns}

    def id_kind(self, column: str) -> str:
        """The column whose values ``column``'s are (its group's ``same_ids_as``, or itself): a value's key is
        hashed with that column's name, so that the same value of two columns of one kind has one key."""
        group = self.groups_by_column.get(column)
        return column if group is None or group.same_ids_as is None else group.same_ids_as

    @property
    def label_tasks(self) -> list[LabelTask]:
        """The label columns a reader reads, as tasks in order: ``labels``, or ``label`` as the one binary task."""
        if self.labels:
            return self.labels
        label = self.label
        return [LabelTask(label.column, label.positive, label.negative, label.threshold)]

    @property
    def tasks(self) -> list[Task] | None:
        """The tasks of ``labels``; ``None`` for the one binary ``label`` (its metrics keep their bare names)."""
        return [task.task for task in self.labels] if self.labels else None

    @property
    def added_columns(self) -> list[str]:
        """The names of the joined and derived columns, which the files lack."""
        return [*(name for join in self.joins for name in join.columns), *(column.name for column in self.derived)]

    @property
    def dense_columns(self) -> list[str]:
        return [name for group in self.dense for name in group.columns]

    @property
    def categorical_columns(self) -> list[str]:
        return [name for group in self.categorical for name in group.columns]

    def format_options(self, config_class: type[FormatT]) -> FormatT:
        """``format`` as the options of the format a reader reads (a ``CsvConfig`` for CSV files, say): a reader of
        one format given a schema of another stops here."""
        if not isinstance(self.format, config_class):
            raise TypeError(
                f"`format` must be configured by a {config_class.__name__}, but is {self.format!r} instead."
            )
        return self.format


def with_full_keys(schema: TabularDataSection) -> TabularDataSection:
    """``schema`` as a reader feeding hash tables needs it: every hashed categorical value (and any value a format
    hashes, such as a libSVM ``idx``) keeps its full 64-bit key instead of a row among ``num_buckets``, which then
    only sizes the tables (their capacity). Vocabulary columns keep their ids, already rows of their own."""
    categorical = [group if group.vocabulary else replace(group, num_buckets=0) for group in schema.categorical]
    return replace(schema, categorical=categorical, format=schema.format.with_full_keys())
