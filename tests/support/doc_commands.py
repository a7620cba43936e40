"""Running the documents' commands as a user types them: in a folder laid out as the checkout, one command after
another, ``cd`` kept, and the commands that never end on their own (a server, a run that waits for data) started,
asked what they answer, and stopped."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from support.paths import ROOT
from support.warm_runs import WARM, warm_venv

# What a command run in the folder finds of the checkout: linked, not copied (the tests read, never write them).
CHECKOUT_ENTRIES = (
    "src",
    "tests",
    "examples",
    "benchmarks",
    "scripts",
    "pyproject.toml",
    "setup.py",
    "MANIFEST.in",
    "docs_hooks",
    "mkdocs.yml",
    "recipes.yaml",
    "README.md",
    "docs",
)
COMMAND_TIMEOUT_S = 600


@dataclass
class Outcome:
    """What one command did: its exit code and output, and what a started server answered."""

    command: str
    returncode: int
    output: str
    answered: dict[str, object] = field(default_factory=dict)
    seconds: float = 0.0

    def describe(self) -> str:
        return f"$ {self.command}\nexit {self.returncode} after {self.seconds:.1f} s\n{self.output[-4000:]}"


def checkout_folder(root: Path) -> Path:
    """``root`` laid out as the checkout for the documents' commands: its entries linked, and ``.venv`` the
    virtual environment running the tests (whose ``bin/`` the commands name), its ``python -m recipes`` forked from
    a warm interpreter (``support.warm_runs``) in the environment of ``env_with``."""
    root.mkdir(parents=True, exist_ok=True)
    for entry in CHECKOUT_ENTRIES:
        (root / entry).symlink_to(ROOT / entry)
    warm_venv(root / ".venv")
    if (ROOT / ".mypy_cache").is_dir():  # scripts/test.sh's mypy takes up where CI's run left off
        (root / ".mypy_cache").symlink_to(ROOT / ".mypy_cache")
    return root


def run_command(command: str, cwd: Path, env: Mapping[str, str]) -> Outcome:
    """``command`` through bash in ``cwd``, to its end."""
    start = time.monotonic()
    result = subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )
    return Outcome(command, result.returncode, result.stdout, seconds=time.monotonic() - start)


def _start(command: str, cwd: Path, env: Mapping[str, str]) -> subprocess.Popen[str]:
    """``command`` started through bash, which becomes it (``exec``), so that a signal to the pid reaches it."""
    return subprocess.Popen(
        ["bash", "-c", f"exec {command}"],
        cwd=cwd,
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _read_until(process: subprocess.Popen[str], pattern: str) -> tuple[re.Match[str] | None, str]:
    """The process's output up to the first line matching ``pattern`` (None if it ends first)."""
    assert process.stdout is not None
    seen = []
    for line in process.stdout:
        seen.append(line)
        match = re.search(pattern, line)
        if match:
            return match, "".join(seen)
    return None, "".join(seen)


def _stop(process: subprocess.Popen[str], seen: str) -> tuple[int, str]:
    """SIGTERM to the process, and its exit code and whole output once it ended."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    rest, _ = process.communicate(timeout=COMMAND_TIMEOUT_S)
    return process.returncode, seen + rest


def serve_and_ask(command: str, cwd: Path, env: Mapping[str, str], paths: tuple[str, ...]) -> Outcome:
    """A server's command (``tensorboard --logdir ...``) started; once it says where it serves, each of ``paths``
    fetched from there (JSON); then stopped. The exit code is 0 where it answered them all."""
    process = _start(command, cwd, env)
    match, seen = _read_until(process, r"at (http://\S+/) ")
    answered: dict[str, object] = {}
    if match is not None:
        for path in paths:
            with urllib.request.urlopen(match.group(1) + path, timeout=COMMAND_TIMEOUT_S) as response:
                answered[path] = json.loads(response.read())
    _, output = _stop(process, seen)
    return Outcome(command, 0 if match is not None else 1, output, answered)


def run_until_it_waits(command: str, cwd: Path, env: Mapping[str, str], waiting: str) -> Outcome:
    """A run that would wait forever (``dataset.follow=true``) started; once it prints ``waiting`` it is sent
    SIGTERM, which must save and exit 0. Its exit code is that of the stopped run (1 if it never waited)."""
    process = _start(command, cwd, env)
    match, seen = _read_until(process, re.escape(waiting))
    returncode, output = _stop(process, seen)
    return Outcome(command, returncode if match is not None else 1, output)


def env_with(extra: Mapping[str, str]) -> dict[str, str]:
    """The tests' environment for a command, with ``extra``; the numba cache of the checkout, and the warm
    interpreter of ``checkout_folder``'s ``python`` and of the ranks torchrun starts (``WarmInterpreter.run_env``)."""
    env = WARM.run_env(os.environ)
    env.setdefault("NUMBA_CACHE_DIR", str(ROOT / ".numba_cache"))
    env.update({"WANDB_MODE": "offline", "WANDB_SILENT": "true", **extra})
    return env
