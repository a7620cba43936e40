"""The tutorials' pages (``docs/tutorials/``): the files and commands they show, and the folders of ``examples/``
that hold those files.

A fenced block whose info string gives a path as its title (```` ```python title="my_project/linreg.py" ````,
which the site shows above the block) is a file of a tutorial; a ``bash`` block holds its commands, one a line. A
tutorial is a page that shows files. Each tutorial's files are kept, as they are, in ``examples/`` under the same
path (``examples/my_project/linreg.py``): the tests run those folders, and ``test_examples.py`` checks that the page
shows them as they are, so neither can drift from what is tested.
"""

from __future__ import annotations

import re
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from support.paths import DOCS, EXAMPLES

BLOCK = re.compile(r'^```(\w+)(?: +title="([^"]+)")?\n(.*?)^```$', re.MULTILINE | re.DOTALL)
# Every tutorial: a page of docs/tutorials/ that shows the files of a folder of one's own.
TUTORIALS = tuple(
    page
    for page in sorted((DOCS / "tutorials").glob("*.md"))
    if any(path for _, path, _ in BLOCK.findall(page.read_text()))
)
# The second tutorial, and the folder of examples/ that holds its files.
TABLES_TUTORIAL = DOCS / "tutorials" / "sparse-tables.md"
TABLES_FOLDER = "my_recommender"
VENV_BIN = "RECIPES/.venv/bin/"
BYTECODE = "__pycache__"  # What importing an example's module leaves in its folder; the pages do not show it.


@dataclass(frozen=True)
class Tutorial:
    files: dict[str, str]
    """The text of each file shown, by its path (``my_project/linreg.py``), which is also its path in ``examples/``."""
    commands: list[str]


def read_tutorial(page: Path) -> Tutorial:
    """The files and commands of the tutorial's page."""
    files: dict[str, str] = {}
    commands: list[str] = []
    for language, path, body in BLOCK.findall(page.read_text()):
        if path:
            files[path] = body
        elif language == "bash":
            commands += [line for line in body.splitlines() if line.strip()]
    return Tutorial(files, commands)


def example_files(folder: str) -> dict[str, str]:
    """The text of each file in ``examples/<folder>``, by its path under ``examples/`` (as ``Tutorial.files``)."""
    paths = sorted(path for path in (EXAMPLES / folder).rglob("*") if path.is_file() and BYTECODE not in path.parts)
    return {path.relative_to(EXAMPLES).as_posix(): path.read_text() for path in paths}


def copy_example(folder: str, destination: Path) -> Path:
    """``examples/<folder>`` copied into ``destination``, as a user's own folder outside the checkout (so a run
    writes its output there, not into the checkout); the copy's path."""
    return Path(shutil.copytree(EXAMPLES / folder, destination / folder, ignore=shutil.ignore_patterns(BYTECODE)))


def command_args(command: str) -> list[str]:
    """A tutorial command as argv, its trailing comment dropped and ``RECIPES/.venv/bin/`` this Python's bin."""
    args = shlex.split(command, comments=True)
    if args and args[0].startswith(VENV_BIN):
        args[0] = str(Path(sys.executable).parent / args[0][len(VENV_BIN) :])
    return args
