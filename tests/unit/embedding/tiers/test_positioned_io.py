"""Reads and writes of many small values at scattered offsets of a file."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from embedding.tiers.positioned_io import read_each, write_each


def test_values_written_at_scattered_offsets_read_back_and_a_read_past_the_end_is_refused(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    os.ftruncate(fd, 1 << 20)
    offsets = np.array([1 << 19, 12, 4096 - 4], dtype=np.int64)  # the last one straddles two pages
    values = np.arange(6, dtype=np.float32).reshape(3, 2)

    write_each(fd, offsets, values)
    back = np.empty_like(values)
    read_each(fd, offsets[::-1].copy(), back)

    assert np.array_equal(back, values[::-1])
    assert os.pread(fd, 8, 12) == values[1].tobytes()
    with pytest.raises(OSError, match="the file ends before"):
        read_each(fd, np.array([(1 << 20) - 4], dtype=np.int64), back[:1])
    os.close(fd)
