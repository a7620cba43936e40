"""A README tutorial, read from the README itself: the files it shows and the commands it runs.

A fenced block whose info string names a path after the language (```` ```python my_project/mf.py ````) is
a file of the tutorial; a ``bash`` block holds its commands, one a line. Tests build the tutorial
from this text, so the README cannot drift from what is tested.
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCK = re.compile(r"^```(\w+)(?: +(\S+))?\n(.*?)^```$", re.MULTILINE | re.DOTALL)
VENV_BIN = "RECIPES/.venv/bin/"


@dataclass(frozen=True)
class Tutorial:
    files: dict[str, str]
    commands: list[str]

    def write(self, root: Path) -> None:
        for path, text in self.files.items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(text)


def read_tutorial(heading: str) -> Tutorial:
    """The files and commands of the README section under ``heading`` (up to the next ``## ``)."""
    text = README.read_text()
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end != -1 else len(text)]
    files: dict[str, str] = {}
    commands: list[str] = []
    for language, path, body in BLOCK.findall(section):
        if path:
            files[path] = body
        elif language == "bash":
            commands += [line for line in body.splitlines() if line.strip()]
    return Tutorial(files, commands)


def command_args(command: str) -> list[str]:
    """A tutorial command as argv, its trailing comment dropped and ``RECIPES/.venv/bin/`` this Python's bin."""
    args = shlex.split(command, comments=True)
    if args and args[0].startswith(VENV_BIN):
        args[0] = str(Path(sys.executable).parent / args[0][len(VENV_BIN) :])
    return args
