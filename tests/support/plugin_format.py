"""Files in ``tests/plugin_package``'s ``jsonl`` data format (the package itself: the ``plugin`` fixture)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_lines(path: Path, rows: list[dict[str, Any]]) -> str:
    """One JSON object per line; a null value is left out of its line, as JSON-lines writers often do."""
    lines = (json.dumps({key: value for key, value in row.items() if value is not None}) for row in rows)
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)
