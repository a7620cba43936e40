"""Many small reads and writes at scattered places of a file, each one system call, without the interpreter.

A disk store reads and writes a row's record (a hundred-odd bytes) and its slot (4 bytes) wherever the row is,
for tens of thousands of rows a step. Mapping the file would make each of them a page fault (for a write, with
the file system's bookkeeping of the page) and leave the pages, and the system's neighbours of each, in the
process's resident memory; ``pread`` and ``pwrite`` copy the bytes through the system's cache and map nothing.
A loop of them compiled by numba costs one to three microseconds a call on a loaded 2-core machine, and
releases the interpreter's lock, so that the writer thread's calls run beside the step.
"""

from __future__ import annotations

import os

import numba
import numpy as np
import numpy.typing as npt
from numba import types

# The C library's own calls, linked by name (so the compiled loops can be cached); a buffer's address passes as
# the integer it is, which the platform's calling convention passes as it passes a pointer.
_pread = types.ExternalFunction("pread", types.intp(types.intc, types.intp, types.uintp, types.int64))
_pwrite = types.ExternalFunction("pwrite", types.intp(types.intc, types.intp, types.uintp, types.int64))


@numba.njit(nogil=True, cache=True)  # type: ignore[untyped-decorator]
def _read_each(fd: int, offsets: npt.NDArray[np.int64], address: int, size: int) -> int:
    for i in range(offsets.size):
        if _pread(fd, address + i * size, size, offsets[i]) != size:
            return i
    return -1


@numba.njit(nogil=True, cache=True)  # type: ignore[untyped-decorator]
def _write_each(fd: int, offsets: npt.NDArray[np.int64], address: int, size: int) -> int:
    for i in range(offsets.size):
        if _pwrite(fd, address + i * size, size, offsets[i]) != size:
            return i
    return -1


def read_each(fd: int, offsets: npt.NDArray[np.int64], out: npt.NDArray[np.generic]) -> None:
    """Read ``out[i]`` (C-contiguous) from the bytes of file ``fd`` at ``offsets[i]``."""
    size = out.nbytes // max(out.shape[0], 1)
    failed = _read_each(fd, offsets, out.ctypes.data, size)
    if failed >= 0:  # again, where Python says why (an interrupted call goes on)
        data = os.pread(fd, size, int(offsets[failed]))
        if len(data) != size:
            raise OSError(f"Could not read {size} bytes at offset {offsets[failed]}: the file ends before.")
        out[failed] = np.frombuffer(data, dtype=out.dtype).reshape(out.shape[1:])
        read_each(fd, offsets[failed + 1 :], out[failed + 1 :])


def write_each(fd: int, offsets: npt.NDArray[np.int64], values: npt.NDArray[np.generic]) -> None:
    """Write ``values[i]`` (C-contiguous) to the bytes of file ``fd`` at ``offsets[i]``."""
    size = values.nbytes // max(values.shape[0], 1)
    failed = _write_each(fd, offsets, values.ctypes.data, size)
    if failed >= 0:  # again, where Python says why (an interrupted call goes on)
        if os.pwrite(fd, values[failed].tobytes(), int(offsets[failed])) != size:
            raise OSError(f"Could not write {size} bytes at offset {offsets[failed]}: the disk took fewer.")
        write_each(fd, offsets[failed + 1 :], values[failed + 1 :])
