"""The numba tokeniser of delimited text (CSV, TSV): one pass over a chunk turns its lines into columns.

Why not pyarrow's or pandas' parser: measured on a Criteo-format TSV (docs/benchmarks.md, "Data readers"),
pyarrow's CSV reader at its fastest (two threads, typed columns) and pandas' C parser each take
as long as a bare ``pandas.read_csv``, before a single value is hashed or batched; the goal is a
reader that delivers ready batches at least as fast as that bare read. Tokenising, number
parsing and hashing in one pass over the bytes, with no string object per field, is 4-5x
faster. What the kernel accepts is what RFC 4180 says of a CSV line, less newlines inside
quotes: fields split by one delimiter byte, a field may be quoted and then holds delimiters and
doubled quotes, a line may end in CRLF. Surrounding ASCII whitespace of a value is trimmed.

Per line, the kernel writes the dense values, the keys of the categorical values
(``recsys.tabular.hashing``) and the exact (float64) numbers of the columns that split rows or
derive others into rows of preallocated arrays; a multi-hot field's span is kept for a second
pass, which splits it into its values, and a label's too, which a pass over the whole lines reads
for each task that reads its column (two tasks may read one: a rating and ``rating >= 4``). A line
that does not fit gets a problem code and the column at fault (the task, for a label), which the
reader turns into a sentence with its file and line number.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
import numpy.typing as npt

from recsys.tabular.hashing import FNV_PRIME, NO_QUOTE, bucket_id, finish_key, span_key
from recsys.tabular.tokens import SMALL_COUNT_LOGS, is_space, log_count, number, trim

# What a column of the file is to the kernel.
SKIP, LABEL, DENSE, CATEGORICAL, BAG, NUMBER = range(6)
# What is wrong with a line; ``columns`` say which column (the number of fields, for FIELD_COUNT).
OK, HEADER, FIELD_COUNT, QUOTE, NOT_A_NUMBER, NOT_A_LABEL = range(6)


@dataclass(frozen=True)
class ColumnPlan:
    """What to do with each column of a file, in the kernel's terms; ``slots`` index the output arrays."""

    roles: npt.NDArray[np.int64]
    slots: npt.NDArray[np.int64]
    bases: npt.NDArray[np.uint64]  # per categorical slot, then per bag slot: the column's hash basis
    num_buckets: npt.NDArray[np.uint64]  # per categorical slot: its table's rows, or 0 to keep the key
    fills: npt.NDArray[np.float64]  # per dense slot
    logs: npt.NDArray[np.bool_]  # per dense slot
    # Per task (the labels' columns of the output), in task order; a label column's slot indexes ``label_spans``.
    label_slots: npt.NDArray[np.int64]  # per task: the slot of the column it reads
    label_texts: npt.NDArray[np.uint8]  # every task's allowed values, concatenated
    label_offsets: npt.NDArray[np.int64]  # per allowed value: where its text starts (and, last, the end)
    label_ranges: npt.NDArray[np.int64]  # per task: its first allowed value (and, last, their count)
    label_clicks: npt.NDArray[np.float32]  # per allowed value: 1 for a click, 0 for none
    thresholds: npt.NDArray[np.float64]  # per task; NaN: the label is one of its allowed values
    regression: npt.NDArray[np.bool_]  # per task: the label is the number itself


@dataclass(frozen=True)
class TokenizedLines:
    labels: npt.NDArray[np.float32]  # [lines, tasks]
    label_spans: npt.NDArray[np.int64]  # [lines, label columns, (start, end)]
    dense: npt.NDArray[np.float32]  # [lines, dense columns]
    ids: npt.NDArray[np.int64]  # [lines, categorical columns]: ids, or keys (as int64) where num_buckets is 0
    bag_spans: npt.NDArray[np.int64]  # [lines, bag columns, (start, end, quoted with escapes)]
    numbers: npt.NDArray[np.float64]  # [lines, number columns]: NaN where empty
    codes: npt.NDArray[np.int64]
    columns: npt.NDArray[np.int64]


# Untyped: numba compiles these for the types of their arguments.
@numba.njit(cache=True, nogil=True)
def _label(data, start, end, texts, offsets, clicks, first, last, threshold, regression):  # type: ignore[no-untyped-def]
    """A task's label of a (trimmed) field and whether it is one: the number itself for a regression task, the
    click (0 or 1) of a binary one (a number >= ``threshold``, or one of its allowed values ``first:last``)."""
    if regression or not np.isnan(threshold):
        value, ok = number(data, start, end)
        if not (ok and np.isfinite(value) and end > start):
            return 0.0, False
        return (value if regression else (1.0 if value >= threshold else 0.0)), True
    for k in range(first, last):
        text = texts[offsets[k] : offsets[k + 1]]
        if len(text) == end - start and _at(data, start, text):
            return clicks[k], True
    return 0.0, False


@numba.njit(cache=True, nogil=True)
def _labels(data, spans, task_slots, texts, offsets, ranges, clicks, thresholds, regression, labels, codes, columns):  # type: ignore[no-untyped-def]
    """Each task's label of every well-formed line, from its column's field; a field that is no label of its task
    makes the line NOT_A_LABEL, with the task's index in ``columns``."""
    for line in range(len(codes)):
        if codes[line] != OK:
            continue
        for task in range(len(task_slots)):
            first, last = trim(data, spans[line, task_slots[task], 0], spans[line, task_slots[task], 1])
            value, ok = _label(
                data, first, last, texts, offsets, clicks, ranges[task], ranges[task + 1], thresholds[task],
                regression[task],
            )  # fmt: skip
            labels[line, task] = value
            if not ok:
                codes[line], columns[line] = NOT_A_LABEL, task
                break


@numba.njit(cache=True, nogil=True)
def _tokenize(  # type: ignore[no-untyped-def]
    data, line_starts, skip, delimiter, quote, roles, slots, bases, buckets, fills, logs, small_count_logs,
    label_spans, dense, ids, bag_spans, numbers, codes, columns,
):  # fmt: skip
    num_columns = len(roles)
    for line in range(len(line_starts) - 1):
        if line < skip:
            codes[line] = HEADER
            continue
        cursor, stop = line_starts[line], line_starts[line + 1] - 1  # the newline
        if stop > cursor and data[stop - 1] == 13:
            stop -= 1
        column, code, at = 0, OK, 0
        while True:
            escaped, hashed, state, counted, count = False, False, np.uint64(0), False, np.int64(0)
            if quote >= 0 and cursor < stop and data[cursor] == quote:
                start = cursor + 1
                cursor = start
                while True:
                    while cursor < stop and data[cursor] != quote:
                        cursor += 1
                    if cursor + 1 < stop and data[cursor + 1] == quote:
                        escaped, cursor = True, cursor + 2
                        continue
                    break
                if cursor >= stop or (cursor + 1 < stop and data[cursor + 1] != delimiter):
                    code = QUOTE
                    break
                end, cursor = cursor, cursor + 1
            elif column < num_columns and roles[column] == CATEGORICAL:
                # Hashed while scanned: FNV's multiply chain runs beside the search for the delimiter.
                start, state = cursor, bases[slots[column]]
                while cursor < stop and data[cursor] != delimiter:
                    state = (state ^ np.uint64(data[cursor])) * FNV_PRIME
                    cursor += 1
                end, hashed = cursor, True
            elif column < num_columns and (roles[column] == DENSE or roles[column] == NUMBER):
                # A plain count (digits only, as most are) is read while scanned.
                start, digits_only = cursor, True
                while cursor < stop and data[cursor] != delimiter:
                    digit = np.int64(data[cursor]) - 48
                    if digit < 0 or digit > 9:
                        digits_only = False
                    count = count * 10 + digit
                    cursor += 1
                end = cursor
                counted = digits_only and 0 < end - start <= 15
            else:
                start = cursor
                while cursor < stop and data[cursor] != delimiter:
                    cursor += 1
                end = cursor
            if column < num_columns and roles[column] != SKIP:
                role, slot = roles[column], slots[column]
                if role == CATEGORICAL:
                    if hashed and (start == end or not (is_space(data[start]) or is_space(data[end - 1]))):
                        key = finish_key(state) if start < end else np.uint64(0)
                    else:  # Quoted, or whitespace to trim: hashed again, as the text is meant.
                        key = span_key(data, start, end, bases[slot], quote if escaped else NO_QUOTE)
                    ids[line, slot] = bucket_id(key, buckets[slot])
                elif role == BAG:
                    bag_spans[line, slot, 0], bag_spans[line, slot, 1], bag_spans[line, slot, 2] = start, end, escaped
                elif role in (DENSE, NUMBER):
                    empty = False
                    if counted:
                        value, ok = float(count), True
                    else:
                        first, last = trim(data, start, end)
                        value, ok = number(data, first, last)
                        empty = first == last
                        if empty:  # A dense column's fill; a number's NaN (missing).
                            value, ok = (fills[slot] if role == DENSE else np.nan), True
                    if (not ok or not (np.isfinite(value) or empty)) and code == OK:
                        code, at = NOT_A_NUMBER, column
                    if role == NUMBER:
                        numbers[line, slot] = value
                    else:
                        dense[line, slot] = log_count(value, small_count_logs) if logs[slot] else value
                else:  # A label's field, read per task once the line is known to be whole.
                    label_spans[line, slot, 0], label_spans[line, slot, 1] = start, end
            column += 1
            if cursor >= stop:
                break
            cursor += 1  # The delimiter; a line ending in one ends in an empty field.
        if code != QUOTE and column != num_columns:  # The first thing to say of a line that is cut wrong.
            code, at = FIELD_COUNT, column
        codes[line], columns[line] = code, at


@numba.njit(cache=True)
def _bag_sizes(data, spans, separator):  # type: ignore[no-untyped-def]
    sizes = np.zeros(len(spans), dtype=np.int64)
    width = len(separator)
    for row in range(len(spans)):
        start, end = spans[row, 0], spans[row, 1]
        count, position = 1, start
        while position + width <= end:
            if _at(data, position, separator):
                count, position = count + 1, position + width
            else:
                position += 1
        sizes[row] = count
    return sizes


@numba.njit(cache=True)
def _bag_keys(data, spans, separator, offsets, basis, quote):  # type: ignore[no-untyped-def]
    keys = np.zeros(offsets[-1], dtype=np.uint64)
    width = len(separator)
    for row in range(len(spans)):
        start, end = spans[row, 0], spans[row, 1]
        field_quote = quote if spans[row, 2] else NO_QUOTE
        out, item, position = offsets[row], start, start
        while position + width <= end:
            if _at(data, position, separator):
                keys[out] = span_key(data, item, position, basis, field_quote)
                out, position = out + 1, position + width
                item = position
            else:
                position += 1
        keys[out] = span_key(data, item, end, basis, field_quote)
    return keys


@numba.njit(cache=True)
def _at(data, position, pattern):  # type: ignore[no-untyped-def]
    """Whether ``pattern`` lies in ``data`` at ``position`` (an ``all()`` of a generator does not compile)."""
    for i in range(len(pattern)):  # noqa: SIM110
        if data[position + i] != pattern[i]:
            return False
    return True


@numba.njit(cache=True, nogil=True)
def line_starts(data):  # type: ignore[no-untyped-def]
    """Where the lines of ``data`` (a chunk of whole lines) start, and its end: the newlines are counted
    first, so that the array holds 8 bytes a line, not 8 bytes a byte of the chunk."""
    count = 1
    for position in range(len(data)):
        count += data[position] == 10
    starts = np.empty(count, dtype=np.int64)
    starts[0], count = 0, 1
    for position in range(len(data)):
        if data[position] == 10:
            starts[count], count = position + 1, count + 1
    return starts


def tokenize(
    data: npt.NDArray[np.uint8],
    line_starts: npt.NDArray[np.int64],
    skip_lines: int,
    delimiter: str,
    quote: str | None,
    plan: ColumnPlan,
    num_slots: tuple[int, int, int, int],
) -> TokenizedLines:
    """The lines of ``data`` that start at ``line_starts[:-1]`` (the last entry is the end), the first
    ``skip_lines`` of them headers; ``num_slots`` counts the dense, categorical, bag and number columns."""
    num_lines = len(line_starts) - 1
    num_dense, num_categorical, num_bags, num_numbers = num_slots
    num_label_columns = int(plan.label_slots.max()) + 1 if len(plan.label_slots) else 0
    lines = TokenizedLines(
        labels=np.zeros((num_lines, len(plan.label_slots)), np.float32),
        label_spans=np.zeros((num_lines, num_label_columns, 2), np.int64),
        dense=np.zeros((num_lines, num_dense), np.float32),
        ids=np.zeros((num_lines, num_categorical), np.int64),
        bag_spans=np.zeros((num_lines, num_bags, 3), np.int64),
        numbers=np.zeros((num_lines, num_numbers), np.float64),
        codes=np.zeros(num_lines, np.int64),
        columns=np.zeros(num_lines, np.int64),
    )
    _tokenize(
        data, line_starts, skip_lines, ord(delimiter), NO_QUOTE if quote is None else ord(quote),
        plan.roles, plan.slots, plan.bases, plan.num_buckets, plan.fills, plan.logs, SMALL_COUNT_LOGS,
        lines.label_spans, lines.dense, lines.ids, lines.bag_spans, lines.numbers, lines.codes, lines.columns,
    )  # fmt: skip
    _labels(
        data, lines.label_spans, plan.label_slots, plan.label_texts, plan.label_offsets, plan.label_ranges,
        plan.label_clicks, plan.thresholds, plan.regression, lines.labels, lines.codes, lines.columns,
    )  # fmt: skip
    return lines


def bag_keys(
    data: npt.NDArray[np.uint8], spans: npt.NDArray[np.int64], separator: str, basis: np.uint64, quote: str | None
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64]]:
    """The keys of the values of multi-hot fields (``spans`` rows of start, end, escaped), and the
    offsets of each field's values in them; an empty value (an empty field too) has key 0."""
    pattern = np.frombuffer(separator.encode(), dtype=np.uint8)
    sizes = _bag_sizes(data, spans, pattern)
    offsets = np.zeros(len(spans) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    keys = _bag_keys(data, spans, pattern, offsets, basis, NO_QUOTE if quote is None else ord(quote))
    return keys, offsets
