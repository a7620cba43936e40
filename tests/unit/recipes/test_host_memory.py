"""A user's own glibc malloc settings win over what a training process does with freed host memory (GitHub
issue 17; the memory kept, measured in processes of their own: tests/integration/recipes/test_host_memory.py)."""

from __future__ import annotations

import pytest

from recipes.runtime.host_memory import keep_freed_memory


def test_the_users_own_malloc_settings_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1000000")

    assert keep_freed_memory() == "host memory: glibc's malloc as MALLOC_TRIM_THRESHOLD_ set it"
