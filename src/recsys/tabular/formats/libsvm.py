"""The ``libsvm`` (also libFM: ``label idx:val ...``) and ``libffm`` (``label field:idx:val ...``) data formats.

Their lines bring features of their own, so a schema of these formats declares no columns but the
label. numba tokenises a whole chunk of lines in one pass (no Python loop per row). Features become
sparse features with weights (the ``val``s, which embedding bags multiply their rows by):

- libFFM: one feature per field, ``field<F>`` (``field0``, ``field1``, ...), a bag of its tokens;
- libSVM/libFM with ``num_fields: N``: the k-th token is field ``field<k>`` (the layout of
  one-hot data such as Frappe's, whose every line has one token per field); without it, one bag
  ``features`` of all the tokens.

An ``idx`` is hashed like a categorical value (its text, keyed by the feature's name), so that
``num_buckets`` bounds the tables whatever the index space.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Annotated, Any

import numba
import numpy as np
import numpy.typing as npt

from recipes import PositiveInt, Range
from recsys.click.batch import CTRBatch, make_ctr_batch
from recsys.data.stream import ParsedLines, StreamingLineReader
from recsys.models.embeddings import TableSpec
from recsys.tabular.formats.data_format import DataFormat
from recsys.tabular.formats.format_config import DATA_FORMATS, DataFormatConfig
from recsys.tabular.hashing import bucket_ids, span_keys
from recsys.tabular.row_arrays import object_array, split_rows
from recsys.tabular.schema import TabularDataSection
from recsys.tabular.tokens import number
from recsys.tabular.vocabulary import Encodings


@dataclass
class LibSVMConfig(DataFormatConfig):
    """``format: libsvm``: a label, then ``idx:val`` tokens."""

    name: str = "libsvm"
    num_fields: PositiveInt | None = None
    """The k-th token of a line is field k (``field0``...), at most this many (one-hot data such as Frappe's);
    ``null``: one bag ``features`` of all tokens. libFFM: the number of fields (required)."""
    num_buckets: Annotated[int, Range(ge=2)] = 1_000_000
    """Rows of each field's table (an ``idx`` is hashed like a categorical value)."""

    def check(self, schema: TabularDataSection) -> None:
        if schema.dense or schema.categorical or schema.joins or schema.derived or schema.split.column:
            raise ValueError(
                f"`format: {self.name}` takes its features from the tokens: `dense`, `categorical`, `joins`, "
                "`derived` and `split` must be empty, but are not."
            )
        if schema.labels is not None:
            raise ValueError(
                f"`format: {self.name}` has one label, the first token of a line: `dataset.labels` must be unset, but "
                f"names {len(schema.labels)} tasks; use `label`, or a CSV/TSV or Parquet file for several."
            )

    def with_full_keys(self) -> LibSVMConfig:
        return replace(self, num_buckets=0)

    @property
    def feature_names(self) -> list[str]:
        return [f"field{k}" for k in range(self.num_fields)] if self.num_fields else ["features"]

    @property
    def with_fields(self) -> bool:
        """Whether each token names its field (``field:idx:val``)."""
        return False


@dataclass
class LibFFMConfig(LibSVMConfig):
    """``format: libffm``: a label, then ``field:idx:val`` tokens."""

    name: str = "libffm"

    def check(self, schema: TabularDataSection) -> None:
        """Also: ``num_fields`` is required; checked here rather than as the options are built, since a config
        that names ``libffm`` starts from its default options, which lack it."""
        if self.num_fields is None:
            raise ValueError("`num_fields` must be set for `format: libffm`, but is not.")
        super().check(schema)

    @property
    def with_fields(self) -> bool:
        return True


logger = logging.getLogger(__name__)

# Problem codes of the tokenizer, turned into sentences here.
_OK, _NO_LABEL, _NO_COLON, _BAD_VALUE, _BAD_FIELD, _TOO_MANY, _TOO_FEW = range(7)
_PROBLEMS = {
    _NO_LABEL: "it must start with a numeric label",
    _NO_COLON: "every feature token must look like {token}",
    _BAD_VALUE: "every feature's value must be a finite number",
    _BAD_FIELD: "every field must be an integer in [0, {num_fields})",
    _TOO_MANY: "it must have at most {num_fields} feature tokens",
    _TOO_FEW: "it must have {num_fields} feature tokens, one per field (the k-th token is field k)",
}


@numba.njit(cache=True)
def _tokenize(data, with_fields, num_fields):  # type: ignore[no-untyped-def]
    """Per line: label, problem code; per token: line, field, idx text span, value."""
    num_lines = 0
    for byte in data:
        num_lines += byte == 10
    labels = np.zeros(num_lines, np.float64)
    codes = np.zeros(num_lines, np.int64)
    line_ends = np.zeros(num_lines, np.int64)
    capacity = max(16, len(data) // 4)
    token_line = np.zeros(capacity, np.int64)
    token_field = np.zeros(capacity, np.int64)
    idx_start = np.zeros(capacity, np.int64)
    idx_end = np.zeros(capacity, np.int64)
    values = np.zeros(capacity, np.float32)
    num_tokens = 0
    position = 0
    for line in range(num_lines):
        end = position
        while data[end] != 10:
            end += 1
        line_ends[line] = end + 1
        stop = end - 1 if end > position and data[end - 1] == 13 else end  # CRLF
        first_token = num_tokens
        count = 0
        cursor = position
        while cursor < stop:
            while cursor < stop and (data[cursor] == 32 or data[cursor] == 9):
                cursor += 1
            if cursor >= stop:
                break
            token_end = cursor
            while token_end < stop and data[token_end] != 32 and data[token_end] != 9:
                token_end += 1
            if count == 0:
                label, ok = number(data, cursor, token_end)
                labels[line] = label
                if not ok:
                    codes[line] = _NO_LABEL
                    break
            else:
                colon1 = cursor
                while colon1 < token_end and data[colon1] != 58:
                    colon1 += 1
                colon2 = colon1 + 1
                while colon2 < token_end and data[colon2] != 58:
                    colon2 += 1
                if (
                    colon1 >= token_end
                    or (with_fields and colon2 >= token_end)
                    or (not with_fields and colon2 < token_end)
                ):
                    codes[line] = _NO_COLON
                    break
                field = count - 1
                if with_fields:
                    field_value, ok = number(data, cursor, colon1)
                    if not ok or field_value != int(field_value) or not 0 <= field_value < num_fields:
                        codes[line] = _BAD_FIELD
                        break
                    field = int(field_value)
                    start_idx, end_idx, value_start = colon1 + 1, colon2, colon2 + 1
                else:
                    start_idx, end_idx, value_start = cursor, colon1, colon1 + 1
                    if num_fields > 0 and field >= num_fields:
                        codes[line] = _TOO_MANY
                        break
                    if num_fields == 0:
                        field = 0
                value, ok = number(data, value_start, token_end)
                if not ok or not np.isfinite(value) or end_idx <= start_idx:
                    codes[line] = _BAD_VALUE if end_idx > start_idx else _NO_COLON
                    break
                if num_tokens == capacity:
                    capacity *= 2
                    token_line = np.concatenate((token_line, np.zeros(capacity - num_tokens, np.int64)))
                    token_field = np.concatenate((token_field, np.zeros(capacity - num_tokens, np.int64)))
                    idx_start = np.concatenate((idx_start, np.zeros(capacity - num_tokens, np.int64)))
                    idx_end = np.concatenate((idx_end, np.zeros(capacity - num_tokens, np.int64)))
                    values = np.concatenate((values, np.zeros(capacity - num_tokens, np.float32)))
                token_line[num_tokens], token_field[num_tokens] = line, field
                idx_start[num_tokens], idx_end[num_tokens], values[num_tokens] = start_idx, end_idx, value
                num_tokens += 1
            count += 1
            cursor = token_end
        if count == 0:
            codes[line] = _NO_LABEL
        elif codes[line] == _OK and not with_fields and num_fields > 0 and count - 1 < num_fields:
            codes[line] = _TOO_FEW  # A token missing: which field would the ones after it be?
        if codes[line] != _OK:
            num_tokens = first_token  # A bad line leaves no token behind.
        position = end + 1
    n = num_tokens
    return labels, codes, line_ends, token_line[:n], token_field[:n], idx_start[:n], idx_end[:n], values[:n]


class LibSVMReader(StreamingLineReader[CTRBatch]):
    """Reads libSVM/libFM or libFFM files as ``schema`` says (its ``label``, and its ``format``'s options); the
    other arguments are ``StreamingLineReader``'s."""

    def __init__(self, paths: str | Sequence[str], schema: TabularDataSection, **kwargs: Any) -> None:
        self._schema = schema
        self._tokens = schema.format_options(LibSVMConfig)
        self._with_fields = self._tokens.with_fields
        self._num_fields = self._tokens.num_fields or 0
        self.feature_names = self._tokens.feature_names
        self._warned_missing_fields = False
        super().__init__(paths, **kwargs)

    def parse(self, buffer: bytes, file_index: int, at_file_start: bool) -> ParsedLines:
        data = np.frombuffer(buffer, dtype=np.uint8)
        labels, codes, line_ends, token_line, token_field, starts, ends, values = _tokenize(
            data, self._with_fields, self._num_fields
        )
        clicks, label_ok = self._clicks(labels)
        codes = np.where((codes == _OK) & ~label_ok, -1, codes)
        problems = {int(line): self._problem(int(codes[line]), labels[line]) for line in np.flatnonzero(codes != _OK)}
        num_lines = len(codes)
        bags = []
        for field in range(max(self._num_fields, 1)):
            mine = token_field == field if self._num_fields else np.ones(len(token_field), dtype=np.bool_)
            keys = span_keys(data, starts[mine], ends[mine], self.feature_names[field])
            ids = bucket_ids(keys, self._tokens.num_buckets)
            bags.append(_per_line_bags(token_line[mine], ids, values[mine], num_lines))
        valid = codes == _OK
        if self._with_fields and not self._warned_missing_fields:
            self._warn_missing_fields(token_line, token_field, valid, file_index)
        return ParsedLines(line_ends, valid, (clicks, *(b for pair in bags for b in pair)), problems)

    def _warn_missing_fields(
        self, token_line: npt.NDArray[np.int64], token_field: npt.NDArray[np.int64], valid: npt.NDArray[np.bool_],
        file_index: int,
    ) -> None:  # fmt: skip
        """libFFM lines may leave fields out (their bags are empty): legal, but said once, since it may also be a
        file of another layout."""
        fields_per_line = np.zeros(len(valid), dtype=np.int64)
        pairs = (
            np.unique(np.stack([token_line, token_field]), axis=1) if len(token_line) else np.zeros((2, 0), np.int64)
        )
        np.add.at(fields_per_line, pairs[0], 1)
        short = np.flatnonzero(valid & (fields_per_line < self._num_fields))
        if len(short):
            self._warned_missing_fields = True
            logger.warning(
                "%d lines of a chunk of %s hold fewer than the %d fields of `num_fields` (the first: %d of them); "
                "their missing fields read as empty bags.",
                len(short), self.file_name(file_index), self._num_fields, fields_per_line[short[0]],
            )  # fmt: skip

    def make_batch(self, columns: tuple[npt.NDArray[Any], ...]) -> CTRBatch:
        labels, *bags = columns
        features = {}
        weights = {}
        for k, name in enumerate(self.feature_names):
            ids, vals = bags[2 * k], bags[2 * k + 1]
            lengths = np.fromiter((len(bag) for bag in ids), dtype=np.int64, count=len(ids))
            flat = np.concatenate([*ids, np.zeros(0, np.int64)]).astype(np.int64)
            features[name] = (flat, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
            weights[name] = np.concatenate([*vals, np.zeros(0, np.float32)]).astype(np.float32)
        batch = make_ctr_batch(np.zeros((len(labels), 0), np.float32), features, labels)
        return _with_weights(batch, weights)

    def empty_columns(self) -> tuple[npt.NDArray[Any], ...]:
        empty = object_array([])
        return (np.zeros(0, np.float32), *([empty, empty] * len(self.feature_names)))

    def _clicks(self, labels: npt.NDArray[np.float64]) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_]]:
        spec = self._schema.label
        if spec.threshold is not None:
            return (labels >= spec.threshold).astype(np.float32), np.isfinite(labels)
        positive = np.isin(labels, [float(v) for v in spec.positive])
        negative = np.isin(labels, [float(v) for v in spec.negative])
        return positive.astype(np.float32), positive | negative

    def _problem(self, code: int, label: float) -> str:
        if code == -1:
            allowed = ", ".join([*self._schema.label.positive, *self._schema.label.negative])
            return f"the label must be one of {allowed}, but is {label:g} instead"
        token = "field:idx:val" if self._with_fields else "idx:val"
        return _PROBLEMS[code].format(token=token, num_fields=self._num_fields)


@DATA_FORMATS.register("libffm", LibFFMConfig)
@DATA_FORMATS.register("libsvm", LibSVMConfig)
class LibSVMFormat(DataFormat):
    """libSVM/libFM and libFFM files, read by ``LibSVMReader``: a weighted sparse feature per field."""

    def reader(
        self, paths: str | Sequence[str], *, split: str, encodings: Encodings | None, **options: Any
    ) -> LibSVMReader:
        """Every line is a row of every split (a split needs a column to cut by), and no column is encoded."""
        return LibSVMReader(paths, self.schema, **options)

    def sparse_features(self) -> list[str]:
        return self.schema.format_options(LibSVMConfig).feature_names

    def tables(self) -> list[TableSpec]:
        """One table per field, which sums the rows of its tokens weighted by their values."""
        num_buckets = self.schema.format_options(LibSVMConfig).num_buckets
        return [TableSpec(name, num_buckets, (name,)) for name in self.sparse_features()]


def _per_line_bags(
    lines: npt.NDArray[np.int64], ids: npt.NDArray[np.int64], values: npt.NDArray[np.float32], num_lines: int
) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
    """Per line, the bag of ids of its tokens and their values (tokens come in line order)."""
    bounds = np.searchsorted(lines, np.arange(num_lines + 1))
    return split_rows(ids, bounds), split_rows(values, bounds)


def _with_weights(batch: CTRBatch, weights: dict[str, npt.NDArray[np.float32]]) -> CTRBatch:
    import torch

    from embedding import JaggedIds, SparseFeatures

    features = {
        name: JaggedIds(jagged.ids, jagged.offsets, torch.from_numpy(weights[name]))
        for name, jagged in batch.sparse.items()
    }
    return CTRBatch(batch.dense, SparseFeatures(features), batch.labels)
