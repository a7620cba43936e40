"""Fixtures of the integration tests: they run ``python -m recipes`` and other programs in processes of their own."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

CLI_TIMEOUT_S = 120

RunCli = Callable[..., "subprocess.CompletedProcess[str]"]


def _run_cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "recipes", *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )


@pytest.fixture(scope="session")
def run_cli() -> RunCli:
    """``run_cli(*args, cwd=folder)`` runs ``python -m recipes ARGS`` in a new process, as a user does."""
    return _run_cli
