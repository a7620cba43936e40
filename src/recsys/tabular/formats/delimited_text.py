"""The ``csv`` and ``tsv`` data formats: their options, and click-prediction batches from their files.

``recsys.tabular.delimited``'s kernel turns each chunk of whole lines into columns in one pass
(the streaming, shuffling, sharding and resume are ``recsys.data.stream``'s); ``TabularReader`` plans
what each column is to the kernel, adds the schema's joined and derived columns
(``recsys.tabular.added_columns``), turns keys into ids, and says in a sentence what is wrong
with a line that does not fit. CRLF line ends, quoted fields (without newlines inside) and gzip
are handled; a header line is checked against the schema and skipped.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from recipes import ConfigError, DataError
from recsys.click.batch import CTRBatch, make_ctr_batch
from recsys.data.stream import START, ParsedLines, StreamingLineReader, reading
from recsys.tabular import delimited
from recsys.tabular.added_columns import AddedColumns, RowOrders, dense_column
from recsys.tabular.delimited import ColumnPlan, TokenizedLines
from recsys.tabular.formats.data_format import ColumnFormat, ColumnReader
from recsys.tabular.formats.format_config import DATA_FORMATS, DataFormatConfig
from recsys.tabular.hashing import bucket_ids, column_basis
from recsys.tabular.joins import Bags
from recsys.tabular.row_arrays import object_array, split_rows
from recsys.tabular.schema import TabularDataSection, expand_names
from recsys.tabular.split_files import paths_key, refuse_rowless_split
from recsys.tabular.text_layout import (
    TextLayout,
    UnreadableText,
    check_delimiter,
    csv_quoting,
    encoding_name,
    read_text_table,
)
from recsys.tabular.vocabulary import Encodings, KeyCounter, ValueCounts


@dataclass
class CsvConfig(DataFormatConfig):
    """``format: csv``: lines of fields split by a delimiter, a comma unless ``delimiter`` says otherwise."""

    name: str = "csv"
    delimiter: str | None = None
    """The field separator, one character or several (MovieLens-1M's ``::``, matched left to right outside quoted
    fields); ``null``: the format's (``,`` for csv, a tab for tsv)."""
    quote_char: str | None = '"'
    """Fields may be quoted with this (``null``: no quoting), one ASCII character that the delimiter does not hold;
    a quoted field must not hold a newline."""
    header: bool = True
    """Whether each file's first line names the columns."""
    column_names: list[str] | None = None
    """The columns' names in file order, for files without a header (brace ranges allowed)."""
    encoding: str = "utf-8"
    """The files' text encoding, one that writes ASCII as ASCII (``latin-1`` for MovieLens-1M's ``.dat`` files,
    ``cp1252``...); values are read as their text, so a title has one id whatever file it comes from."""

    reads_side_tables: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.column_names is not None:
            self.column_names = expand_names(self.column_names)
        if not self.header and self.column_names is None:
            raise ValueError("`column_names` must name the columns of files without a header, but is not set.")
        if self.quote_char is not None and (len(self.quote_char) != 1 or not self.quote_char.isascii()):
            raise ValueError(f"`quote_char` must be one ASCII character or null, but is {self.quote_char!r} instead.")
        check_delimiter(self.field_delimiter, self.quote_char)
        encoding_name(self.encoding)  # An unknown encoding stops here.

    def check(self, schema: TabularDataSection) -> None:
        """Named columns must hold every column the schema reads from the file, and a sequence of the file's must be
        split by a separator, so that ``show`` and the config check refuse them before any file is opened."""
        added = {*(name for join in schema.joins for name in join.columns), *(column.name for column in schema.derived)}
        for group in schema.categorical:
            unsplit = [name for name in group.columns if name not in added]
            if group.sequence and group.separator is None and unsplit:
                raise ValueError(
                    f"A sequence column of a {self.name} file must hold its values split by `separator`, but "
                    f"{unsplit} have none: a field of one value is no sequence."
                )
        if self.column_names is None:
            return
        labels = [task.column for task in schema.label_tasks]
        read = [*labels, *schema.dense_columns, *schema.categorical_columns, schema.split.column]
        missing = [name for name in read if name is not None and name not in added and name not in self.column_names]
        if missing:
            raise ValueError(
                f"`format.column_names` must name every column the schema reads from the files, but lacks "
                f"{missing[:5]}{' ...' if len(missing) > 5 else ''} (it names {self.column_names[:8]}"
                f"{' ...' if len(self.column_names) > 8 else ''})."
            )

    @property
    def field_delimiter(self) -> str:
        return self.delimiter or ","

    @property
    def layout(self) -> TextLayout:
        return TextLayout(self.field_delimiter, self.quote_char, self.encoding)

    def read_side_table(self, raw: bytes) -> pa.Table:
        """A joined table's file, every column as text."""
        return read_text_table(raw, self.layout, None if self.header else self.column_names, skip_header=False)


@dataclass
class TsvConfig(CsvConfig):
    """``format: tsv``: CSV's options, with fields split by a tab unless ``delimiter`` says otherwise."""

    name: str = "tsv"

    @property
    def field_delimiter(self) -> str:
        return self.delimiter or "\t"


class TabularReader(StreamingLineReader[CTRBatch], ColumnReader):
    """Reads the files of ``paths`` as ``schema`` says, keeping the rows of ``split`` (``train``, ``valid`` or
    ``test``: the schema's ``split`` says which rows each keeps); ``encodings`` are the vocabularies and value
    counts the schema needs (``recsys.tabular.vocabulary``). The other arguments are ``StreamingLineReader``'s.

    Batches hold the dense columns in schema order as ``dense``, one sparse feature per
    categorical column (named after it), and the label as 0/1.
    """

    def __init__(
        self,
        paths: str | Sequence[str],
        schema: TabularDataSection,
        *,
        split: str = "train",
        encodings: Encodings | None = None,
        **kwargs: Any,
    ) -> None:
        self._schema = schema
        self._text = schema.format_options(CsvConfig)
        self._text_layout = self._text.layout
        self._encodings = encodings or Encodings({}, {})
        self._split = split
        super().__init__(paths, paths_key=paths_key(split), **kwargs)
        self._names = self._column_names()
        for task in schema.label_tasks:
            if task.column not in self._names:
                raise DataError(
                    f"The schema's column '{task.column}' must be a column of {self.file_name(0)}, but the "
                    f"file's columns are {self._names} instead."
                )
        try:
            self._added = AddedColumns(
                schema,
                self._names,
                split,
                self._encodings.counts,
                histories=self._encodings.histories,
                ranks=self._encodings.ranks,
                file_name=self.file_name(0),
            )
        except ConfigError as error:
            raise DataError(str(error)) from None
        groups = {name: group for group in schema.categorical for name in group.columns}
        self._groups = groups
        self._single = [name for name in schema.categorical_columns if not groups[name].multi_hot]
        self._bags = [name for name in schema.categorical_columns if groups[name].multi_hot]
        self._file_bags = [name for name in self._bags if name in self._names]
        self._vocabulary_columns = [name for name in schema.categorical_columns if groups[name].vocabulary]
        # File columns only read for their keys (join keys, counted sources), in slots after the features'.
        self._hidden_keys = [name for name in self._added.file_keys if name not in self._single]
        self._key_slots = {name: k for k, name in enumerate([*self._single, *self._hidden_keys])}
        # Columns whose keys the kernel hands out, for ids made after it: vocabularies, join keys, counted
        # sources, and added columns (whose keys are filled in after the kernel).
        keyed = [name for name in self._single if groups[name].vocabulary or name in self._added.file_keys]
        added = [name for name in self._single if name not in self._names]
        self._keyed = {*keyed, *added, *self._hidden_keys}
        self._number_slots = {name: k for k, name in enumerate(self._added.file_numbers)}
        self._plan = self._column_plan()

    def check_first_rows(self, num_records: int = 100) -> None:
        """As any streaming reader's, and a validation or test split of no row is refused (``split_files``)."""
        super().check_first_rows(num_records)
        refuse_rowless_split(self, self._split, len(self._files), header_lines=int(self._text.header))

    def count_values(self) -> dict[str, ValueCounts]:
        counters = {name: KeyCounter() for name in self._vocabulary_columns}
        counters.update(self._added.counters())
        for start, buffer in self.line_chunks(START):
            chunk = self._keys_of(buffer, start.file_index, start.offset == 0)
            for k, name in enumerate(self._single):
                if name in counters:
                    counters[name].add(chunk.keys[chunk.valid, k])
            for name, (keys, offsets) in chunk.bags.items():
                if name in counters:
                    counters[name].add(keys[np.repeat(chunk.valid, np.diff(offsets))])
            for name, (keys, orders) in self._added.count_sources(chunk.file_keys, chunk.file_numbers).items():
                counters[name].add(keys[chunk.valid], None if orders is None else orders[chunk.valid])
        return {name: counter.totals() for name, counter in counters.items()}

    def row_orders(self) -> RowOrders:
        chunks = (
            (chunk.file_keys, chunk.file_numbers, chunk.valid)
            for chunk in (
                self._keys_of(buffer, start.file_index, start.offset == 0) for start, buffer in self.line_chunks(START)
            )
        )
        return self._added.gather_orders(chunks)

    def column_texts(self, columns: Sequence[str]) -> Iterator[dict[str, pa.Array]]:
        """Each chunk of lines parsed by pyarrow's CSV parser with the format's delimiter and quoting, every column
        as text; a header line is skipped, a line of another number of fields left out."""
        for start, buffer in self.line_chunks(START):
            with self._decoding(start.file_index):
                header = self._text.header and start.offset == 0
                table = read_text_table(buffer, self._text_layout, self._names, header, list(columns))
            yield {name: table.column(name).combine_chunks() for name in columns}

    # The format -------------------------------------------------------------------------------

    def parse(self, buffer: bytes, file_index: int, at_file_start: bool) -> ParsedLines:
        chunk = self._keys_of(buffer, file_index, at_file_start)
        if len(self._encodings.vocabularies) != len(self._vocabulary_columns):
            raise ValueError(f"`encodings` must map every vocabulary column {self._vocabulary_columns}, but do not.")
        ids = chunk.lines.ids[:, : len(self._single)]
        for k, name in enumerate(self._single):
            if name in self._keyed:
                ids[:, k] = self._ids(name, ids[:, k].view(np.uint64))
        bags = [self._bag_ids(name, *chunk.bags[name]) for name in self._bags]
        labels = chunk.lines.labels if len(self._schema.label_tasks) > 1 else chunk.lines.labels[:, 0]
        columns: tuple[npt.NDArray[Any], ...] = (labels, chunk.lines.dense, ids, *bags)
        return ParsedLines(chunk.line_ends, chunk.valid, columns, chunk.problems)

    def _keys_of(self, buffer: bytes, file_index: int, at_file_start: bool) -> _Chunk:
        """The lines of a chunk as the kernel leaves them (keys where ids come later), with the added columns
        filled in, the rows outside the split marked invalid, and the multi-hot columns' keys."""
        raw = buffer
        with self._decoding(file_index):
            buffer, delimiter = self._text_layout.normalize(raw)
        data = np.frombuffer(buffer, dtype=np.uint8)
        line_starts = delimited.line_starts(data)
        # The file's line ends (a resume's offsets): its lines are the normalised text's (``text_layout``).
        line_ends = line_starts[1:] if buffer is raw else delimited.line_starts(np.frombuffer(raw, np.uint8))[1:]
        skip = 1 if self._text.header and at_file_start else 0
        if skip:
            self._check_header(buffer[: line_starts[1]], file_index, delimiter)
        lines = delimited.tokenize(
            data,
            line_starts,
            skip,
            delimiter,
            self._text.quote_char,
            self._plan,
            (len(self._schema.dense_columns), len(self._key_slots), len(self._file_bags), len(self._number_slots)),
        )
        problems = {
            int(line): self._problem(lines, int(line), buffer[line_starts[line] : line_starts[line + 1]], delimiter)
            for line in np.flatnonzero(lines.codes > delimited.HEADER)
        }
        quote = self._text.quote_char
        bags = {
            name: delimited.bag_keys(
                data, lines.bag_spans[:, k], self._separator(name), column_basis(self._schema.id_kind(name)), quote
            )
            for k, name in enumerate(self._file_bags)
        }
        valid = lines.codes == delimited.OK
        keys = lines.ids.view(np.uint64)
        file_keys = {name: keys[:, self._key_slots[name]] for name in self._added.file_keys}
        numbers = {name: lines.numbers[:, k] for name, k in self._number_slots.items()}
        if not self._added.empty:
            added = self._added.apply(file_keys, numbers)
            if added.keep is not None:
                valid &= added.keep
            for line, problem in added.problems.items():
                if lines.codes[line] != delimited.HEADER:  # The header holds no values (no key, say) to fault.
                    problems.setdefault(line, problem)
            for name, values in added.keys.items():
                keys[:, self._key_slots[name]] = values
            bags.update(added.bags)
            dense_numbers = {**numbers, **added.numbers}
            for slot, (name, fill, log) in enumerate(self._dense_specs()):
                if name in dense_numbers:
                    lines.dense[:, slot] = dense_column(dense_numbers[name], fill, log)
        return _Chunk(line_ends, lines, valid, keys, problems, bags, file_keys, numbers)

    def make_batch(self, columns: tuple[npt.NDArray[Any], ...]) -> CTRBatch:
        labels, dense, single, *bags = columns
        one_each = np.arange(len(labels) + 1, dtype=np.int64)
        by_column = single.T.copy()  # One copy makes every column's ids contiguous.
        features = {name: (by_column[k], one_each) for k, name in enumerate(self._single)}
        for name, bag in zip(self._bags, bags):
            lengths = np.fromiter((len(ids) for ids in bag), dtype=np.int64, count=len(bag))
            offsets = np.zeros(len(bag) + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            features[name] = (np.concatenate([*bag, np.zeros(0, np.int64)]), offsets)
        ordered = {name: features[name] for name in self._schema.categorical_columns}
        return make_ctr_batch(dense, ordered, labels)

    def empty_columns(self) -> tuple[npt.NDArray[Any], ...]:
        num_tasks = len(self._schema.label_tasks)
        return (
            np.zeros((0, num_tasks) if num_tasks > 1 else 0, np.float32),
            np.zeros((0, len(self._schema.dense_columns)), np.float32),
            np.zeros((0, len(self._single)), np.int64),
            *(object_array([]) for _ in self._bags),
        )

    # Columns ---------------------------------------------------------------------------------

    def _ids(self, name: str, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        if name in self._encodings.vocabularies:
            return self._encodings.vocabularies[name].lookup(keys)
        return bucket_ids(keys, self._groups[name].num_buckets)

    def _bag_ids(self, name: str, keys: npt.NDArray[np.uint64], offsets: npt.NDArray[np.int64]) -> npt.NDArray[Any]:
        """Per line, the ids of the values of its multi-hot field of column ``name`` (a sequence's latest
        ``max_len``)."""
        return split_rows(self._ids(name, keys), offsets, self._groups[name].max_len)

    def _separator(self, name: str) -> str:
        """What splits a multi-hot field of ``name``: its group's separator, or (a field of one value) a byte that no
        text holds."""
        return self._groups[name].separator or "\0"

    def _dense_specs(self) -> list[tuple[str, float, bool]]:
        return [(name, group.fill, group.log) for group in self._schema.dense for name in group.columns]

    def _column_plan(self) -> ColumnPlan:
        schema = self._schema
        tasks = schema.label_tasks
        label_slots = {name: slot for slot, name in enumerate(dict.fromkeys(task.column for task in tasks))}
        roles = np.full(len(self._names), delimited.SKIP, dtype=np.int64)
        slots = np.zeros(len(self._names), dtype=np.int64)
        position = {name: index for index, name in enumerate(self._names)}
        for role, slot_of in (
            (delimited.DENSE, {name: slot for slot, name in enumerate(schema.dense_columns)}),
            (delimited.CATEGORICAL, self._key_slots),
            (delimited.BAG, {name: slot for slot, name in enumerate(self._file_bags)}),
            (delimited.NUMBER, self._number_slots),
            (delimited.LABEL, label_slots),
        ):
            for name, slot in slot_of.items():
                if name not in position:
                    continue  # An added column: filled in after the kernel.
                if roles[position[name]] not in (delimited.SKIP, delimited.DENSE):
                    raise DataError(f"The column '{name}' of {self.file_name(0)} must have one role, but has several.")
                roles[position[name]], slots[position[name]] = role, slot
        values = [[] if task.kind == "regression" else [*task.positive, *task.negative] for task in tasks]
        encoded = [value.strip().encode() for task_values in values for value in task_values]
        key_columns = [*self._single, *self._hidden_keys]
        return ColumnPlan(
            roles=roles,
            slots=slots,
            bases=np.array([column_basis(schema.id_kind(name)) for name in key_columns], np.uint64),
            num_buckets=np.array(
                [0 if name in self._keyed else self._groups[name].num_buckets for name in key_columns], np.uint64
            ),
            fills=np.array([fill for _, fill, _ in self._dense_specs()], np.float64),
            logs=np.array([log for _, _, log in self._dense_specs()], np.bool_),
            label_slots=np.array([label_slots[task.column] for task in tasks], np.int64),
            label_texts=np.frombuffer(b"".join(encoded), dtype=np.uint8),
            label_offsets=np.cumsum([0, *(len(text) for text in encoded)], dtype=np.int64),
            label_ranges=np.cumsum([0, *(len(task_values) for task_values in values)], dtype=np.int64),
            label_clicks=np.array(
                [float(k < len(task.positive)) for task, texts in zip(tasks, values) for k in range(len(texts))],
                np.float32,
            ),
            thresholds=np.array([np.nan if task.threshold is None else task.threshold for task in tasks], np.float64),
            regression=np.array([task.kind == "regression" for task in tasks], np.bool_),
        )

    def _column_names(self) -> list[str]:
        if not self._text.header:
            assert self._text.column_names is not None
            return list(self._text.column_names)
        with self._files[0] as file, reading(self.file_name(0)):
            first = file.readline()
        if not first:
            raise DataError(
                f"`{paths_key(self._split)}` must name files that start with a header line, but {self.file_name(0)} "
                "is empty."
            )
        with self._decoding(0):
            line, delimiter = self._text_layout.normalize(first)
        names = self._split_line(line.decode("utf-8-sig", errors="replace"), delimiter)
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise DataError(
                f"The header of {self.file_name(0)} must name each column once, but names {', '.join(repeated)} twice."
            )
        return names

    def _split_line(self, text: str, delimiter: str) -> list[str]:
        """The fields of a line of normalised text (``text_layout``), split by ``delimiter``, the byte that stands for
        the format's."""
        row = next(csv.reader([text.rstrip("\r\n")], delimiter=delimiter, **csv_quoting(self._text.quote_char)), [])
        return [field.strip() for field in row]

    @contextmanager
    def _decoding(self, file_index: int) -> Iterator[None]:
        """Text that is not of the format's encoding, or a chunk that leaves no byte to stand for a long delimiter,
        is a ``DataError`` naming the file."""
        try:
            yield
        except UnreadableText as error:
            raise DataError(
                f"{self.file_name(file_index)} must be {self._text.encoding} text (`dataset.format.encoding`) split "
                f"by {self._text.field_delimiter!r}, but is not: {error}."
            ) from None

    def _check_header(self, line: bytes, file_index: int, delimiter: str) -> None:
        names = self._split_line(line.decode("utf-8-sig", errors="replace"), delimiter)
        if names != self._names:
            raise DataError(
                f"Line 1 of {self.file_name(file_index)} must name the columns {self._names} as the first file "
                f"does, but names {names} instead."
            )

    def _problem(self, lines: TokenizedLines, line: int, text: bytes, delimiter: str) -> str:
        code, column = int(lines.codes[line]), int(lines.columns[line])
        if code == delimited.FIELD_COUNT:
            return f"it must have {len(self._names)} fields, but has {column} instead"
        if code == delimited.QUOTE:
            return "a quoted field must end with a quote, followed by the delimiter or the line's end"
        fields = self._split_line(text.decode(errors="replace"), delimiter)
        task = self._schema.label_tasks[column] if code == delimited.NOT_A_LABEL else None
        if task is not None:  # The kernel names the task whose label is wrong.
            column = self._names.index(task.column)
        value = fields[column] if column < len(fields) else ""
        name = self._names[column]
        if task is None:
            return f"`{name}` must be a finite number or empty, but is {value!r} instead"
        if task.threshold is not None or task.kind == "regression":
            return f"the label `{name}` must be a finite number, but is {value!r} instead"
        allowed = ", ".join(repr(v) for v in [*task.positive, *task.negative])
        return f"the label `{name}` must be one of {allowed}, but is {value!r} instead"


@dataclass(frozen=True)
class _Chunk:
    """The lines of a chunk: the kernel's output, which rows are kept, the categorical keys (ids where no key
    is needed; single-valued columns first, then hidden key columns), what is wrong with the bad lines, the
    multi-hot columns' keys, and the keys and numbers of the file columns that ``AddedColumns`` reads."""

    line_ends: npt.NDArray[np.int64]
    lines: TokenizedLines
    valid: npt.NDArray[np.bool_]
    keys: npt.NDArray[np.uint64]
    problems: dict[int, str]
    bags: dict[str, Bags]
    file_keys: dict[str, npt.NDArray[np.uint64]]
    file_numbers: dict[str, npt.NDArray[np.float64]]


@DATA_FORMATS.register("tsv", TsvConfig)
@DATA_FORMATS.register("csv", CsvConfig)
class DelimitedText(ColumnFormat):
    """CSV and TSV files, read by ``TabularReader``."""

    reader_class = TabularReader
