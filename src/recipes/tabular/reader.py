"""Click-prediction batches from delimited text files (CSV, TSV), as a ``dataset`` schema declares them.

``recipes.tabular.delimited``'s kernel turns each chunk of whole lines into columns in one pass
(the streaming, shuffling, sharding and resume are ``recipes.data.stream``'s); this class plans
what each column is to the kernel, turns keys into ids, and says in a sentence what is wrong
with a line that does not fit. CRLF line ends, quoted fields (without newlines inside) and gzip
are handled; a header line is checked against the schema and skipped.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from recipes.click.batch import CTRBatch, make_ctr_batch
from recipes.data.reader import DataError
from recipes.data.stream import START, ParsedLines, StreamingLineReader
from recipes.tabular import delimited
from recipes.tabular.delimited import ColumnPlan, TokenizedLines
from recipes.tabular.hashing import bucket_ids, column_basis
from recipes.tabular.schema import TabularDataSection
from recipes.tabular.vocabulary import KeyCounter, Vocabulary


class TabularReader(StreamingLineReader[CTRBatch]):
    """Reads the files of ``paths`` as ``schema`` says; the other arguments are ``StreamingLineReader``'s.

    Batches hold the dense columns in schema order as ``dense``, one sparse feature per
    categorical column (named after it), and the label as 0/1.
    """

    def __init__(
        self,
        paths: str | Sequence[str],
        schema: TabularDataSection,
        *,
        vocabularies: Mapping[str, Vocabulary] | None = None,
        **kwargs: Any,
    ) -> None:
        self._schema = schema
        self._vocabularies = dict(vocabularies or {})
        super().__init__(paths, **kwargs)
        self._names = self._column_names()
        missing = [
            c for c in (schema.label.column, *schema.dense_columns, *schema.categorical_columns) if c not in self._names
        ]
        if missing:
            raise DataError(
                f"The schema's column '{missing[0]}' must be a column of {self.file_name(0)}, but the file's "
                f"columns are {self._names} instead."
            )
        groups = {name: group for group in schema.categorical for name in group.columns}
        self._single = [name for name in schema.categorical_columns if groups[name].separator is None]
        self._bags = [
            (name, groups[name].separator or "") for name in schema.categorical_columns if name not in self._single
        ]
        self._vocabulary_columns = [name for name in schema.categorical_columns if groups[name].vocabulary]
        # The kernel hands out keys (0 buckets) where a vocabulary maps them, ids otherwise.
        self._buckets = np.array(
            [0 if groups[name].vocabulary else groups[name].num_buckets for name in self._single], dtype=np.uint64
        )
        self._bag_buckets = [groups[name].num_buckets for name, _ in self._bags]
        self._plan = self._column_plan()

    def count_values(self) -> dict[str, tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64]]]:
        """The keys of the values of the vocabulary columns in the well-formed rows of every file, and
        their counts: one pass over the data, for ``recipes.tabular.vocabulary``."""
        counters = {name: KeyCounter() for name in self._vocabulary_columns}
        for start, buffer in self.line_chunks(START):
            chunk = self._tokenize(buffer, start.file_index, start.record_number)
            valid = chunk.lines.codes == delimited.OK
            for k, name in enumerate(self._single):
                if name in counters:
                    counters[name].add(chunk.lines.ids[valid, k].view(np.uint64))
            for (name, _), (keys, offsets) in zip(self._bags, chunk.bag_keys):
                if name in counters:
                    counters[name].add(keys[np.repeat(valid, np.diff(offsets))])
        return {name: counter.totals() for name, counter in counters.items()}

    # The format -------------------------------------------------------------------------------

    def parse(self, buffer: bytes, file_index: int, first_line: int) -> ParsedLines:
        chunk = self._tokenize(buffer, file_index, first_line)
        lines = chunk.lines
        if len(self._vocabularies) != len(self._vocabulary_columns):
            raise ValueError(f"`vocabularies` must map every vocabulary column {self._vocabulary_columns}, but do not.")
        for k, name in enumerate(self._single):
            if name in self._vocabularies:
                lines.ids[:, k] = self._vocabularies[name].lookup(lines.ids[:, k].view(np.uint64))
        bags = [self._bag_ids(name, keys, offsets) for (name, _), (keys, offsets) in zip(self._bags, chunk.bag_keys)]
        columns: tuple[npt.NDArray[Any], ...] = (lines.labels, lines.dense, lines.ids, *bags)
        return ParsedLines(chunk.line_ends, lines.codes == delimited.OK, columns, chunk.problems)

    def _tokenize(self, buffer: bytes, file_index: int, first_line: int) -> _Chunk:
        data = np.frombuffer(buffer, dtype=np.uint8)
        line_starts = delimited.line_starts(data)
        line_ends = line_starts[1:]
        skip = 1 if self._schema.header and first_line == 0 else 0
        if skip:
            self._check_header(buffer[: line_ends[0]], file_index)
        lines = delimited.tokenize(
            data,
            line_starts,
            skip,
            self._schema.field_delimiter,
            self._schema.quote_char,
            self._plan,
            (len(self._schema.dense_columns), len(self._single), len(self._bags)),
        )
        problems = {
            int(line): self._problem(lines, int(line), buffer[line_starts[line] : line_ends[line]])
            for line in np.flatnonzero(lines.codes > delimited.HEADER)
        }
        bag_keys = [
            delimited.bag_keys(
                data, lines.bag_spans[:, k], separator, self._plan.bases[len(self._single) + k], self._schema.quote_char
            )
            for k, (_, separator) in enumerate(self._bags)
        ]
        return _Chunk(line_ends, lines, problems, bag_keys)

    def make_batch(self, columns: tuple[npt.NDArray[Any], ...]) -> CTRBatch:
        labels, dense, single, *bags = columns
        one_each = np.arange(len(labels) + 1, dtype=np.int64)
        by_column = single.T.copy()  # One copy makes every column's ids contiguous.
        features = {name: (by_column[k], one_each) for k, name in enumerate(self._single)}
        for (name, _), bag in zip(self._bags, bags):
            lengths = np.fromiter((len(ids) for ids in bag), dtype=np.int64, count=len(bag))
            offsets = np.zeros(len(bag) + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            features[name] = (np.concatenate([*bag, np.zeros(0, np.int64)]), offsets)
        ordered = {name: features[name] for name in self._schema.categorical_columns}
        return make_ctr_batch(dense, ordered, labels)

    def empty_columns(self) -> tuple[npt.NDArray[Any], ...]:
        return (
            np.zeros(0, np.float32),
            np.zeros((0, len(self._schema.dense_columns)), np.float32),
            np.zeros((0, len(self._single)), np.int64),
            *(_object_array([]) for _ in self._bags),
        )

    # Columns ---------------------------------------------------------------------------------

    def _bag_ids(self, name: str, keys: npt.NDArray[np.uint64], offsets: npt.NDArray[np.int64]) -> npt.NDArray[Any]:
        """Per line, the ids of the values of its multi-hot field of column ``name``."""
        if name in self._vocabularies:
            ids = self._vocabularies[name].lookup(keys)
        else:
            ids = bucket_ids(keys, self._bag_buckets[[n for n, _ in self._bags].index(name)])
        return _object_array(np.split(ids, offsets[1:-1]))

    def _column_plan(self) -> ColumnPlan:
        schema = self._schema
        roles = np.full(len(self._names), delimited.SKIP, dtype=np.int64)
        slots = np.zeros(len(self._names), dtype=np.int64)
        position = {name: index for index, name in enumerate(self._names)}
        for role, names in (
            (delimited.DENSE, schema.dense_columns),
            (delimited.CATEGORICAL, self._single),
            (delimited.BAG, [name for name, _ in self._bags]),
            (delimited.LABEL, [schema.label.column]),
        ):
            for slot, name in enumerate(names):
                roles[position[name]], slots[position[name]] = role, slot
        label = schema.label
        values = [*label.positive, *label.negative]
        encoded = [value.strip().encode() for value in values]
        return ColumnPlan(
            roles=roles,
            slots=slots,
            bases=np.array([column_basis(name) for name in (*self._single, *(n for n, _ in self._bags))], np.uint64),
            num_buckets=self._buckets,
            fills=np.array([group.fill for group in schema.dense for _ in group.columns], np.float64),
            logs=np.array([group.log for group in schema.dense for _ in group.columns], np.bool_),
            label_texts=np.frombuffer(b"".join(encoded), dtype=np.uint8),
            label_offsets=np.cumsum([0, *(len(text) for text in encoded)], dtype=np.int64),
            label_clicks=np.array([1.0] * len(label.positive) + [0.0] * len(label.negative), np.float32),
            threshold=float("nan") if label.threshold is None else label.threshold,
        )

    def _column_names(self) -> list[str]:
        if not self._schema.header:
            assert self._schema.column_names is not None
            return list(self._schema.column_names)
        with self._files[0] as file:
            first = file.readline()
        if not first:
            raise DataError(f"{self.file_name(0)} must start with a header line, but is empty.")
        return self._split_line(first.decode("utf-8-sig", errors="replace"))

    def _split_line(self, text: str) -> list[str]:
        quoting = {"quotechar": self._schema.quote_char} if self._schema.quote_char else {"quoting": csv.QUOTE_NONE}
        row = next(csv.reader([text.rstrip("\r\n")], delimiter=self._schema.field_delimiter, **quoting), [])
        return [field.strip() for field in row]

    def _check_header(self, line: bytes, file_index: int) -> None:
        names = self._split_line(line.decode("utf-8-sig", errors="replace"))
        if names != self._names:
            raise DataError(
                f"Line 1 of {self.file_name(file_index)} must name the columns {self._names} as the first file "
                f"does, but names {names} instead."
            )

    def _problem(self, lines: TokenizedLines, line: int, text: bytes) -> str:
        code, column = int(lines.codes[line]), int(lines.columns[line])
        if code == delimited.FIELD_COUNT:
            return f"it must have {len(self._names)} fields, but has {column} instead"
        if code == delimited.QUOTE:
            return "a quoted field must end with a quote, followed by the delimiter or the line's end"
        fields = self._split_line(text.decode(errors="replace"))
        value = fields[column] if column < len(fields) else ""
        name = self._names[column]
        if code == delimited.NOT_A_NUMBER:
            return f"`{name}` must be a finite number or empty, but is {value!r} instead"
        label = self._schema.label
        if label.threshold is not None:
            return f"the label `{name}` must be a finite number, but is {value!r} instead"
        allowed = ", ".join(repr(v) for v in [*label.positive, *label.negative])
        return f"the label `{name}` must be one of {allowed}, but is {value!r} instead"


@dataclass(frozen=True)
class _Chunk:
    """The lines of a chunk as the kernel left them (keys where a vocabulary maps them), what is wrong
    with the bad ones, and each multi-hot column's keys with their offsets per line."""

    line_ends: npt.NDArray[np.int64]
    lines: TokenizedLines
    problems: dict[int, str]
    bag_keys: list[tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64]]]


def _object_array(parts: Sequence[npt.NDArray[np.int64]]) -> npt.NDArray[Any]:
    """An object array of id arrays, one per row (numpy would stack equal-length arrays otherwise)."""
    bags = np.empty(len(parts), dtype=object)
    for index, part in enumerate(parts):
        bags[index] = part
    return bags
