"""Fixtures of the integration tests: they run ``python -m recipes`` and other programs in processes of their own."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from support import warm_runs

CLI_TIMEOUT_S = 120

RunCli = Callable[..., "subprocess.CompletedProcess[str]"]


def _run_cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return warm_runs.run([sys.executable, "-m", "recipes", *args], cwd, {**os.environ, **(env or {})}, CLI_TIMEOUT_S)


@pytest.fixture(scope="session")
def run_cli() -> RunCli:
    """``run_cli(*args, cwd=folder)`` runs ``python -m recipes ARGS`` in a process of its own, as a user does
    (forked from a warm interpreter: ``support.warm_runs``)."""
    return _run_cli
