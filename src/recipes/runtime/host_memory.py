"""Freed host memory kept for the next step rather than handed back to the system, which glibc's malloc does.

glibc serves a block above its mmap threshold with fresh pages that it unmaps when the block is freed;
it raises that threshold as such blocks come and go, but not above 32 MiB, and it gives back the free
memory at the top of its heap once that exceeds its trim threshold (twice the mmap threshold). A
training step allocates and frees the same large tensors every step (a lookup's pooled rows are
27 MB at 4096 samples x 26 features x 64 floats), and once glibc has handed them back, every step
faults them in again, a page at a time: 6,624 page faults and about 6 ms more in a 7 ms sparse step,
in some runs and not others. Keeping up to 1 GiB of freed memory, and serving blocks up to 32 MiB
from the heap, stops that: DLRM at batch 8192 ran 1.10x the steps/s on one rank, 1.21x on two
(docs/benchmarks.md, "Data-parallel scaling"). A user who tunes glibc's malloc (its ``MALLOC_*_`` variables or
``GLIBC_TUNABLES``) keeps their settings, and ``trainer.keep_freed_memory: false`` turns this off.
"""

from __future__ import annotations

import ctypes
import os
import platform

MMAP_THRESHOLD = 32 << 20
"""Blocks up to this size come from the heap, where freed memory is reused: glibc's own upper bound."""

TRIM_THRESHOLD = 1 << 30
"""The free memory at the top of the heap kept for reuse: a step's worth of large tensors, and then some."""

# mallopt's parameters, from glibc's malloc.h.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")


def keep_freed_memory() -> str:
    """Have glibc's malloc keep freed memory for reuse; return the start-up line that says what was done."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return "host memory: the C library is not glibc; its malloc is left as it is"
    set_by_user = [name for name in _USER_SETTINGS if name in os.environ]
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        set_by_user.append("GLIBC_TUNABLES")
    if set_by_user:
        return f"host memory: glibc's malloc as {', '.join(set_by_user)} set it"
    libc = ctypes.CDLL("libc.so.6")
    if not (libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        return "host memory: glibc's malloc refused the thresholds; left as it is"
    return (
        f"host memory: glibc's malloc keeps up to {TRIM_THRESHOLD >> 20} MiB freed for reuse and serves blocks "
        f"up to {MMAP_THRESHOLD >> 20} MiB from its heap (trainer.keep_freed_memory)"
    )
