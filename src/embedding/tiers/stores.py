"""The backing stores of a tiered shard group: every row with its optimizer state, off the device.

A store holds one record per row of the group's buffer: the row's values, then each optimizer
state's values (``width`` float32s in all), so that fetching a row is one contiguous read. A row no
step has written yet holds nothing: it reads as its initial values (a function of the seed, the
table and the row's id, as on the device) and its fresh optimizer state. So a new table costs no
time to create, whatever its size, and a row's start does not depend on the tier.

:class:`HostStore` keeps the records in host memory (pinned where CUDA is available, so that a
GPU's cache copies from it directly); :class:`DiskStore` in a file on local disk, densely, in the
order rows are first written, found through an index of slots. The file is mapped into memory,
whose pages the system reads on demand and this process lets go of after each use, so that its
resident memory stays the cache's and not the file's.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import mmap
import os
import sys
import threading
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
_MAPPED_BYTES = 128 << 20
"""The pages a disk store's reads and writes may leave mapped into the process before it lets go of them (letting
go costs about a microsecond a page, and some to start: not after every read)."""


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

    def read(self, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        """The records of ``rows``: what was written, else fresh (computed, never read: a fresh row's pages stay
        unmapped). Safe beside a :meth:`write` on another thread, for rows that write does not hold."""
        written = self.written[rows]
        if written.all():
            return self._read_written(rows)
        records = np.empty((rows.size, self.width), dtype=np.float32)
        where = np.flatnonzero(written)
        records[where] = self._read_written(rows[where])
        fresh = np.flatnonzero(~written)
        values = np.empty((fresh.size, self.width), dtype=np.float32)
        self._initializer(rows[fresh], values)
        records[fresh] = values
        return records

    def write(self, rows: npt.NDArray[np.int64], records: npt.NDArray[np.float32]) -> None:
        """Write ``records`` as the distinct ``rows``."""
        self._write(rows, records)
        self.written[rows] = True  # only once the records are in place: a read on another thread trusts it
        self.changed[rows] = True

    def clear(self) -> None:
        """Every row back to fresh (what a checkpoint's load starts from): no row is known to equal a checkpoint."""
        self.written[:] = False
        self.changed[:] = True

    @abstractmethod
    def _read_written(self, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        """The records of ``rows``, every one of them written."""

    @abstractmethod
    def _write(self, rows: npt.NDArray[np.int64], records: npt.NDArray[np.float32]) -> None:
        """Put ``records`` where the distinct ``rows``' records are read from (before they are marked written)."""

    @property
    def description(self) -> str:
        return "host memory"


class HostStore(RowStore):
    """Records in host memory, row ``i`` at index ``i``; pinned where CUDA is available, for the device cache's
    copies."""

    def __init__(self, num_rows: int, width: int, initializer: Initializer) -> None:
        super().__init__(num_rows, width, initializer)
        pin = torch.cuda.is_available()
        # Fresh rows are never read from here (``written`` says so): untouched memory is never mapped in.
        self._tensor = torch.empty((num_rows, width), dtype=torch.float32, pin_memory=pin)
        self._records: npt.NDArray[np.float32] = self._tensor.numpy()

    def _read_written(self, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        return self._records[rows]

    def _write(self, rows: npt.NDArray[np.int64], records: npt.NDArray[np.float32]) -> None:
        self._records[rows] = records


class DiskStore(RowStore):
    """Records in ``path``: a header naming the table, an index of slots, then the records, densely, in the order
    their rows were first written. Created sparse (no time, no disk, to create); a file already at ``path`` is
    reused only if its header says it is this store and its length is whole; anything else is refused, and left
    as it is.

    Why slots, and not row ``i`` at record ``i``: the rows a step evicts are scattered over the whole table (the
    tail of a skewed draw over hundreds of millions of ids), and a record written into a hole of a sparse file
    costs a page of its own that the file system must allocate, zero and enter into the file's extents, about
    22 microseconds a row (``benchmarks/tiered_tables.py``). Here a row's first write appends its record to the
    dense part, in one write with the step's other new rows, and sets the row's slot (4 bytes, so the index's
    pages fill a thousand times faster than the records'); a later write of the row replaces its record in place,
    in a page already allocated. The file never holds more records than rows were written since the store was
    last cleared.
    """

    def __init__(self, path: str, table: str, num_rows: int, width: int, initializer: Initializer) -> None:
        super().__init__(num_rows, width, initializer)
        self.path = path
        header = _header(table, num_rows, width)
        self._records_offset = self.records_offset(num_rows)
        size = disk_store_bytes(num_rows, width)
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
        self._slots = np.frombuffer(self._map, dtype=_slot_dtype(num_rows), count=num_rows, offset=_HEADER_BYTES)
        """Each written row's record; meaningless for the others."""
        self._records = np.frombuffer(self._map, dtype=np.float32, offset=self._records_offset).reshape(num_rows, width)
        self._used = 0
        """The records in use: each written row's one."""
        self._touched = 0
        """Pages mapped in by reads and writes since they were last let go of (see :meth:`_release_pages`)."""
        self._release_lock = threading.Lock()
        # Rows are read and written one by one, wherever they are: reading ahead around each would fill the
        # system's cache with pages no one asked for (zeroed ones, in a sparse file's holes) and cost the most.
        self._advise(_MADV_RANDOM, len(self._map))

    @staticmethod
    def records_offset(num_rows: int) -> int:
        """Where the records start: after the header and the slots' index, at a page of its own."""
        return _HEADER_BYTES + _page_rounded(num_rows * _slot_dtype(num_rows).itemsize)

    def clear(self) -> None:
        super().clear()
        self._used = 0  # no row is written: every record may be reused

    def _read_written(self, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        records = self._records[self._slots[rows]]
        self._release_pages(2 * rows.size)  # the row's slot's page and its record's
        return records

    def _write(self, rows: npt.NDArray[np.int64], records: npt.NDArray[np.float32]) -> None:
        again = self.written[rows]
        self._records[self._slots[rows[again]]] = records[again]
        new = np.flatnonzero(~again)
        first = self._used
        self._append(first, records[new])
        self._slots[rows[new]] = np.arange(first, first + new.size, dtype=self._slots.dtype)
        self._used += new.size
        self._release_pages(2 * int(again.sum()) + new.size)

    def _append(self, first: int, records: npt.NDArray[np.float32]) -> None:
        """Write ``records`` as records ``first`` on, with the file's writes (they never map the pages in)."""
        view = np.ascontiguousarray(records).reshape(-1).view(np.uint8).data
        offset = self._records_offset + first * self.width * 4
        while view.nbytes:
            done = os.pwrite(self._file.fileno(), view, offset)
            view, offset = view[done:], offset + done

    def _release_pages(self, touched: int) -> None:
        """Count ``touched`` pages more mapped in (reads and writes run on two threads), and let go of every page
        once they may take more than ``_MAPPED_BYTES``: they stay in the system's cache, but out of this process's
        resident memory, which stays the cache's and not the file's."""
        with self._release_lock:
            self._touched += touched
            if self._touched * _PAGE_BYTES < _MAPPED_BYTES:
                return
            self._touched = 0
        self._advise(_MADV_DONTNEED, self._records_offset + _page_rounded(self._used * self.width * 4))

    def _advise(self, advice: int, length: int) -> None:
        """Advise the system about the first ``length`` bytes of the mapping (the rest was never mapped in)."""
        if sys.platform == "linux":
            address = ctypes.addressof(ctypes.c_char.from_buffer(self._map))
            ctypes.CDLL(None).madvise(ctypes.c_void_p(address), ctypes.c_size_t(length), advice)

    @property
    def description(self) -> str:
        return f"disk ({self.path})"


def disk_store_bytes(num_rows: int, width: int) -> int:
    """The most disk a :class:`DiskStore` of ``num_rows`` records of ``width`` float32s takes (every row written)."""
    return DiskStore.records_offset(num_rows) + num_rows * width * 4


def _page_rounded(size: int) -> int:
    return -(-size // _PAGE_BYTES) * _PAGE_BYTES


def _slot_dtype(num_rows: int) -> np.dtype[np.unsignedinteger]:
    """4 bytes a slot wherever they suffice."""
    return np.dtype(np.uint32 if num_rows <= np.iinfo(np.uint32).max else np.uint64)


def _header(table: str, num_rows: int, width: int) -> bytes:
    fields = json.dumps(
        {"table": table, "num_rows": num_rows, "width": width, "dtype": "float32", "layout": "slots"}
    ).encode()
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
