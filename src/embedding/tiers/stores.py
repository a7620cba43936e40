"""The backing stores of a tiered shard group: every row with its optimizer state, off the device.

A store holds one record per row of the group's buffer: the row's values, then each optimizer
state's values (``width`` float32s in all), so that fetching a row is one contiguous read. A row no
step has written yet holds nothing: it reads as its initial values (a function of the seed, the
table and the row's id, as on the device) and its fresh optimizer state. So a new table costs no
time to create, whatever its size, and a row's start does not depend on the tier.

:class:`HostStore` keeps the records in host memory (pinned where CUDA is available, so that a
GPU's cache copies from it directly); :class:`DiskStore` in a file on local disk, mapped into
memory, whose pages the system reads on demand and this process lets go of after each use, so
that its resident memory stays the cache's and not the file's.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import mmap
import os
import sys
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import torch

from embedding.table_config import EmbeddingConfigError

Initializer = Callable[[npt.NDArray[np.int64], npt.NDArray[np.float32]], None]
"""Writes into ``out[i]`` the fresh record (initial row, fresh optimizer state) of buffer row ``rows[i]``."""

_MAGIC = b"recipes-row-store\x00"
_HEADER_BYTES = 4096
_MADV_RANDOM = 1
_MADV_DONTNEED = 4
_PAGE_BYTES = 4096
_MAPPED_BYTES = 384 << 20
"""The pages a disk store's reads and writes may leave mapped into the process before it lets go of them: letting
go walks the whole mapping (tens of milliseconds for tens of GB), too slow to do at every step."""


class DamagedStoreError(EmbeddingConfigError):
    """Raised when an existing disk store is not the store of this table (damaged, truncated, or another's) or
    is in use by another process."""


class RowStore(ABC):
    """The records of ``num_rows`` rows of ``width`` float32s each, and which of them hold written values."""

    def __init__(self, num_rows: int, width: int, initializer: Initializer) -> None:
        self.num_rows, self.width = num_rows, width
        self._initializer = initializer
        self.written = np.zeros(num_rows, dtype=np.bool_)
        """Which rows hold values a write put there (the others read as fresh)."""
        self.changed = np.ones(num_rows, dtype=np.bool_)
        """Which rows were written since the last full checkpoint (:meth:`forget_changes`): a delta's rows."""
        self.touched = 0
        """Records read or written since the pages were last let go of (see :meth:`release_pages`)."""

    @property
    @abstractmethod
    def records(self) -> npt.NDArray[np.float32]:
        """Every record, ``[num_rows, width]``: a view of the store's memory."""

    def read(self, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        """The records of ``rows``: what was written, else fresh (computed, never read: a fresh row's pages stay
        unmapped)."""
        written = self.written[rows]
        if written.all():
            self.touched += rows.size
            return self.records[rows]
        records = np.empty((rows.size, self.width), dtype=np.float32)
        where = np.flatnonzero(written)
        self.touched += where.size
        records[where] = self.records[rows[where]]
        fresh = np.flatnonzero(~written)
        values = np.empty((fresh.size, self.width), dtype=np.float32)
        self._initializer(rows[fresh], values)
        records[fresh] = values
        return records

    def write(self, rows: npt.NDArray[np.int64], records: npt.NDArray[np.float32]) -> None:
        self.records[rows] = records
        self.written[rows] = True
        self.changed[rows] = True
        self.touched += rows.size

    def clear(self) -> None:
        """Every row back to fresh (what a checkpoint's load starts from): no row is known to equal a checkpoint."""
        self.written[:] = False
        self.changed[:] = True

    def release_pages(self) -> None:
        """Let go of the pages the reads and writes mapped in (a disk store's, once they may take more than
        ``_MAPPED_BYTES``); they stay in the system's cache."""

    @property
    def description(self) -> str:
        return "host memory"


class HostStore(RowStore):
    """Records in host memory; pinned where CUDA is available, for the device cache's copies."""

    def __init__(self, num_rows: int, width: int, initializer: Initializer) -> None:
        super().__init__(num_rows, width, initializer)
        pin = torch.cuda.is_available()
        # Fresh rows are never read from here (``written`` says so): untouched memory is never mapped in.
        self._tensor = torch.empty((num_rows, width), dtype=torch.float32, pin_memory=pin)
        self._records: npt.NDArray[np.float32] = self._tensor.numpy()

    @property
    def records(self) -> npt.NDArray[np.float32]:
        return self._records


class DiskStore(RowStore):
    """Records in ``path``: a header naming the table, then the records, created sparse (no time, no disk, to
    create). A file already at ``path`` is reused only if its header says it is this store and its length
    is whole; anything else is refused, and left as it is."""

    def __init__(self, path: str, table: str, num_rows: int, width: int, initializer: Initializer) -> None:
        super().__init__(num_rows, width, initializer)
        self.path = path
        header = _header(table, num_rows, width)
        size = _HEADER_BYTES + num_rows * width * 4
        if os.path.exists(path):
            _check_existing(path, table, header, size)
        else:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(path, "wb") as file:
                file.write(header)
                file.truncate(size)
        self._file = open(path, "r+b")  # noqa: SIM115 (held open: its lock says the store is in use)
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.close()
            raise DamagedStoreError(
                f"The disk store of table '{table}' at {path} must be this process's alone, but another process "
                "has it open (a run of the same output directory?): stop that one, or set another storage "
                "directory."
            ) from None
        self._map = mmap.mmap(self._file.fileno(), size)
        self._records = np.frombuffer(self._map, dtype=np.float32, offset=_HEADER_BYTES).reshape(num_rows, width)
        # Rows are read and written one by one, wherever they are: reading ahead around each would fill the
        # system's cache with pages no one asked for (zeroed ones, in a sparse file's holes) and cost the most.
        self._advise(_MADV_RANDOM)

    @property
    def records(self) -> npt.NDArray[np.float32]:
        return self._records

    def release_pages(self) -> None:
        if self.touched * _PAGE_BYTES >= _MAPPED_BYTES:  # each record's page (more than one: counted once)
            self._advise(_MADV_DONTNEED)
            self.touched = 0

    def _advise(self, advice: int) -> None:
        if sys.platform == "linux":
            address = ctypes.addressof(ctypes.c_char.from_buffer(self._map))
            ctypes.CDLL(None).madvise(ctypes.c_void_p(address), ctypes.c_size_t(len(self._map)), advice)

    @property
    def description(self) -> str:
        return f"disk ({self.path})"


def _header(table: str, num_rows: int, width: int) -> bytes:
    fields = json.dumps({"table": table, "num_rows": num_rows, "width": width, "dtype": "float32"}).encode()
    body = _MAGIC + len(fields).to_bytes(4, "little") + fields
    return (body + zlib.crc32(body).to_bytes(4, "little")).ljust(_HEADER_BYTES, b"\x00")


def _check_existing(path: str, table: str, header: bytes, size: int) -> None:
    with open(path, "rb") as file:
        found = file.read(_HEADER_BYTES)
    if not found.startswith(_MAGIC) or len(found) < _HEADER_BYTES:
        raise DamagedStoreError(
            f"The disk store of table '{table}' at {path} must be a row store, but is something else (or damaged): "
            "move it away or set another storage directory; nothing was changed."
        )
    if found != header:
        raise DamagedStoreError(
            f"The disk store of table '{table}' at {path} must hold that table's rows as configured, but its header "
            "differs (damaged, or another table's or shape's): move it away or set another storage directory; "
            "nothing was changed."
        )
    if os.path.getsize(path) != size:
        raise DamagedStoreError(
            f"The disk store of table '{table}' at {path} must be {size:,} bytes long, but is "
            f"{os.path.getsize(path):,} (truncated?): move it away or set another storage directory; nothing "
            "was changed."
        )
