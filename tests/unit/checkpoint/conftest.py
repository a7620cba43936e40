"""Fixtures shared by the checkpoint tests: a checkpoints root on local disk and on fsspec's memory store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fsspec.implementations.memory import MemoryFileSystem


@pytest.fixture(params=["local", "memory"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A checkpoints root that does not exist yet, on each backend with its own commit protocol."""
    if request.param == "local":
        yield str(tmp_path / "checkpoints")
    else:
        yield "memory://run/checkpoints"
        MemoryFileSystem.store.clear()
        MemoryFileSystem.pseudo_dirs[:] = [""]
