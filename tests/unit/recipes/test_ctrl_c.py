"""Ctrl-C outside training (while a job resolves or starts) exits 130 with one line. Ctrl-C during training, in a
real process: tests/integration/recipes/test_ctrl_c.py."""

from __future__ import annotations

import pytest

from recipes.cli import train as run
from recipes.cli.main import main


def test_ctrl_c_outside_training_exits_130_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(run, "train", interrupted)  # what the CLI's train command imports when it runs

    assert main(["train", "ctr_tiny", "-o", "unused"]) == 130
    assert capsys.readouterr().err == "error: interrupted.\n"
