"""The first tutorial (docs/tutorials/your-own-model.md), ``examples/my_project``: its recipe takes overrides of its
own section and suggests its keys (trained and listed in processes of their own:
tests/integration/recipes/test_tutorial.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from recipes.cli.main import main
from support.doc_tutorials import copy_example


def test_the_tutorial_recipe_takes_overrides_of_its_own_section(
    isolated_presets: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(copy_example("my_project", isolated_presets))

    shown = main(["show", "linreg_demo", "data.batch_size=32"])
    shown_out = capsys.readouterr().out
    wrong = main(["show", "linreg_demo", "data.batch=32"])
    wrong_err = capsys.readouterr().err

    assert shown == 0
    assert "batch_size: 32" in shown_out and "imports:\n- linreg" in shown_out
    assert wrong == 2
    assert "Did you mean 'data.batch_size'?" in wrong_err
