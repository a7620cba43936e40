"""What the bytes of a delimited text file become before a parser reads them: UTF-8, fields split by one byte.

Both parsers of CSV/TSV lines, the numba tokeniser (``recsys.tabular.delimited``) and pyarrow's CSV reader (the
texts of values, side tables), split fields at one byte. A file of another encoding (MovieLens-1M's Latin-1 titles)
is decoded and written as UTF-8, so that a value's key is that of its text in any file (the same title in a UTF-8
CSV, a Parquet file or a joined table gets the same id), and a delimiter of several bytes (MovieLens-1M's ``::``)
is replaced, outside quoted fields, by one control byte that the chunk does not hold. Neither adds or removes a
newline (the encoding must write ASCII as ASCII), so a chunk's k-th line is still the file's: the reader's line
ends, from which a run resumes, are taken from the file's bytes.
"""

from __future__ import annotations

import codecs
import csv
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.csv as pa_csv

UTF8 = "utf-8"
_ASCII_PROBE = "\t\n\r \"',;:|0123456789AZaz"
# Bytes that may stand for a delimiter: control bytes that no parser trims as whitespace (9-13) nor reads as a quote.
_STAND_INS = np.array([0x1F, 0x1E, 0x1D, 0x1C, *range(1, 9), 0x0E, 0x0F, *range(0x10, 0x1C)], np.uint8)


class UnreadableText(ValueError):
    """Bytes that are no text of the layout's encoding, or text that holds every byte that could stand for a long
    delimiter (it is no text file)."""


def encoding_name(encoding: str) -> str:
    """The codec's canonical name (``latin-1`` -> ``iso8859-1``); a ``ValueError`` (one line) for an unknown one or
    one that writes ASCII otherwise (UTF-16), whose lines a newline byte cannot find."""
    try:
        name = codecs.lookup(encoding).name
    except LookupError:
        raise ValueError(
            f"`encoding` must be a text encoding Python knows (utf-8, latin-1, cp1252...), but is {encoding!r} instead."
        ) from None
    try:
        same = _ASCII_PROBE.encode(name) == _ASCII_PROBE.encode()
    except UnicodeError:
        same = False
    if not same:
        raise ValueError(
            f"`encoding` must write ASCII as ASCII (as utf-8, latin-1, cp1252 do), so that lines end at a newline "
            f"byte, but is {encoding!r} instead."
        )
    return name


def check_delimiter(delimiter: str, quote_char: str | None) -> None:
    """A ``ValueError`` (one line) for a delimiter that cannot split a line unambiguously: empty, holding a line
    end, or holding the quote character (a quoted field could not be told from a delimiter)."""
    if not delimiter or any(char in delimiter for char in "\r\n"):
        raise ValueError(f"`delimiter` must be one or more characters other than line ends, but is {delimiter!r}.")
    if quote_char is not None and quote_char in delimiter:
        raise ValueError(
            f"`delimiter` must not hold the quote character {quote_char!r} (`quote_char`; null: no quoting), where "
            f"a quoted field could not be told from a delimiter, but is {delimiter!r}."
        )


@dataclass(frozen=True)
class TextLayout:
    """How a file's fields are written: its delimiter (one character or several), quote character and encoding."""

    delimiter: str
    quote_char: str | None
    encoding: str = UTF8

    @property
    def plain(self) -> bool:
        """Whether the parsers read the file's bytes as they are: UTF-8, split by one ASCII byte."""
        return self.utf8 and len(self.delimiter.encode()) == 1

    @property
    def utf8(self) -> bool:
        return codecs.lookup(self.encoding).name == UTF8

    def to_utf8(self, raw: bytes) -> bytes:
        """``raw`` (whole lines) as UTF-8; ``UnreadableText`` where it is no text of the encoding."""
        if self.utf8:
            return raw
        try:
            return raw.decode(self.encoding).encode()
        except UnicodeDecodeError as error:
            raise UnreadableText(f"{error.reason} (byte {raw[error.start : error.start + 1]!r})") from None

    def normalize(self, raw: bytes) -> tuple[bytes, str]:
        """``raw`` (whole lines) as the parsers read it (UTF-8, fields split by one byte), and that byte."""
        if self.plain:
            return raw, self.delimiter
        text = self.to_utf8(raw)
        pattern = np.frombuffer(self.delimiter.encode(), np.uint8)
        if len(pattern) == 1:
            return text, self.delimiter
        data = np.frombuffer(text, np.uint8)
        stand_in = free_byte(data)
        quote = -1 if self.quote_char is None else ord(self.quote_char)
        replaced: npt.NDArray[np.uint8] = _replace_delimiters(data, pattern, quote, stand_in)
        return replaced.tobytes(), chr(stand_in)


def free_byte(data: npt.NDArray[np.uint8]) -> int:
    """A control byte that ``data`` does not hold, to stand for its delimiter."""
    present = _bytes_present(data)
    free = _STAND_INS[~present[_STAND_INS]]
    if not len(free):
        raise UnreadableText(
            "a delimiter of several characters is read as a control byte the text lacks, but this text holds "
            "every one of them: it is no text file"
        )
    return int(free[0])


@numba.njit(cache=True, nogil=True)
def _bytes_present(data):  # type: ignore[no-untyped-def]
    present = np.zeros(256, np.bool_)
    for byte in data:
        present[byte] = True
    return present


@numba.njit(cache=True, nogil=True)
def _replace_delimiters(data, pattern, quote, stand_in):  # type: ignore[no-untyped-def]
    """``data`` with each ``pattern`` outside quoted fields replaced by ``stand_in``, read as the tokeniser reads
    fields: a quote opens a field only at its start, a doubled quote inside is one, and no field spans lines."""
    out = np.empty(len(data), np.uint8)
    size, i, n, width, first = 0, 0, len(data), len(pattern), pattern[0]
    at_field_start = True
    while i < n:
        byte = data[i]
        if at_field_start and byte == quote:
            out[size] = byte
            size += 1
            i += 1
            while i < n and data[i] != 10:
                byte = data[i]
                out[size] = byte
                size += 1
                i += 1
                if byte == quote:
                    if i < n and data[i] == quote:
                        out[size] = quote
                        size += 1
                        i += 1
                        continue
                    break
            at_field_start = False
            continue
        if byte == first and i + width <= n:
            k = 1
            while k < width and data[i + k] == pattern[k]:
                k += 1
            if k == width:
                out[size] = stand_in
                size += 1
                i += width
                at_field_start = True
                continue
        out[size] = byte
        size += 1
        i += 1
        at_field_start = byte == 10
    return out[:size]


def read_text_table(
    raw: bytes, layout: TextLayout, names: list[str] | None, skip_header: bool, columns: list[str] | None = None
) -> pa.Table:
    """The lines of ``raw`` parsed by pyarrow's CSV reader, every column (or ``columns``) as text; ``names``: the
    columns' names (``None``: the first line's, which is then the header); ``skip_header``: the first line is a
    header whose names are not read. A line of another number of fields is left out."""
    data, delimiter = layout.normalize(raw)
    parse = pa_csv.ParseOptions(
        delimiter=delimiter, quote_char=layout.quote_char or False, invalid_row_handler=lambda _: "skip"
    )
    read = pa_csv.ReadOptions(column_names=names, skip_rows=1 if names is not None and skip_header else 0)
    if names is None:
        header = data.split(b"\n", 1)[0].decode("utf-8-sig").rstrip("\r")
        names = next(csv.reader([header], delimiter=delimiter, **csv_quoting(layout.quote_char)), [])
    convert = pa_csv.ConvertOptions(column_types=dict.fromkeys(names, pa.string()), include_columns=columns)
    return pa_csv.read_csv(pa.py_buffer(data), read_options=read, parse_options=parse, convert_options=convert)


def csv_quoting(quote_char: str | None) -> dict[str, Any]:
    """The arguments of Python's ``csv.reader`` for ``quote_char`` (``None``: no quoting)."""
    return {"quotechar": quote_char} if quote_char else {"quoting": csv.QUOTE_NONE}
