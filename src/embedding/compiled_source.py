"""A digest of the source of the functions a cached numba kernel compiles in.

numba's cache checks only the file that defines a kernel for changes. A kernel built around a
spec's functions (an optimizer's update, an eviction policy's score) captures them from another
file; a kernel that also captures the digest of those files is compiled anew when one of them
changes, instead of running a stale, silently different kernel from the cache.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any


def source_digest(*functions: Callable[..., Any] | None) -> str:
    """A digest of the source files that define ``functions`` (``None`` stands for none)."""
    digest = hashlib.sha256()
    for path in sorted({inspect.getfile(function) for function in functions if function is not None}):
        digest.update(Path(path).read_bytes())
    return digest.hexdigest()
