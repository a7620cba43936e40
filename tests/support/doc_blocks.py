"""The fenced blocks of the README and of the documentation pages (``docs/**/*.md``), and the commands of a ``bash``
block, as a user reads them.

A block is named by its file, its language and its first line (``README.md: ```bash .venv/bin/python -m ...``),
which stays the same when text above it moves; ``tests/integration/recipes/test_doc_blocks.py`` runs each or names
the test that does, so that a block nobody runs fails there. The pages of ``docs/reference/`` are left out: they
are generated from the code when the site is built."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from support.paths import DOCS, README, ROOT

GENERATED = DOCS / "reference"
# The README first: the pages' commands read the run its first command trains (`runs/ctr_tiny`).
DOCUMENTS = (README, *sorted(page for page in DOCS.rglob("*.md") if GENERATED not in page.parents))
FENCE = re.compile(r"^```(\w*)(?: +(\S+))?\n(.*?)^```$", re.MULTILINE | re.DOTALL)  # language, title, text


@dataclass(frozen=True)
class Block:
    file: str
    """The document's path in the checkout (``README.md``, ``docs/how-to/hash-tables.md``)."""
    language: str
    """The info string's language (``bash``, ``yaml``, ``python``, ``toml``), or ``""`` for plain text."""
    text: str

    @property
    def name(self) -> str:
        first = next(line for line in self.text.splitlines() if line.strip()).strip()
        return f"{self.file}: ```{self.language} {first}"


def blocks(document: Path) -> list[Block]:
    """Every fenced block of ``document``, in order."""
    file = document.relative_to(ROOT).as_posix()
    return [Block(file, language, text) for language, _, text in FENCE.findall(document.read_text())]


def all_blocks() -> list[Block]:
    """Every fenced block of every document, each name once."""
    found = [block for document in DOCUMENTS for block in blocks(document)]
    names = [block.name for block in found]
    assert len(set(names)) == len(names), f"two blocks begin alike: {sorted(n for n in names if names.count(n) > 1)}"
    return found


def commands(block: Block) -> list[str]:
    """The commands of a ``bash`` block: its lines with backslash continuations joined, comment-only and blank
    lines left out (a trailing comment stays: the shell drops it)."""
    joined = re.sub(r"\\\n\s*", "", block.text)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]
