"""``python -m recipes`` run in this process, as the tests that read its exit code and its one-line errors call it."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from recipes.cli.main import main


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``main(argv)``: its exit code and what it printed to stdout and stderr."""
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def printed_by_main(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """What ``main(argv)`` printed to stdout; it must exit 0 (its stderr says why not). For the commands that read a
    run and write their output (``predict``, ``eval`` and ``export`` on one rank): in a new interpreter they would add
    4-5 s of CPU (torch imported) and nothing that a test of their output checks."""
    code, out, err = run_main(capsys, *argv)
    assert code == 0, err
    return out


def assert_one_line_error(err: str, *fragments: str) -> None:
    """``err`` is one ``error: ...`` line, without a traceback, holding each fragment."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def checkpoints_listing(output_dir: Path | str) -> str:
    """What ``python -m recipes checkpoints OUTPUT_DIR`` prints, run in this process: it only reads the directory,
    so a new interpreter (3 s of CPU to import torch) would add nothing to what the test sees."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["checkpoints", str(output_dir)])
    assert code == 0, out.getvalue()
    return out.getvalue()
