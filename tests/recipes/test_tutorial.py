"""The README's first tutorial: a user's own recipe in a folder of their own, trained with `python -m recipes train`.

The tutorial's folder is ``examples/my_project`` (its module and its presets file, as the README shows them:
``test_examples.py`` checks it); each test copies it out of the checkout, as the user's own folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from readme_tutorial import copy_example

from recipes.cli import main


def test_the_tutorial_recipe_is_listed_and_trains(tmp_path: Path, run_cli: Any, read_jsonl: Any) -> None:
    project = copy_example("my_project", tmp_path)

    listed = run_cli("list", cwd=project)
    trained = run_cli("train", "linreg_demo", "-o", "out", cwd=project)

    assert listed.returncode == 0, listed.stderr
    assert "linreg_demo" in listed.stdout and "ctr_tiny" in listed.stdout
    assert trained.returncode == 0, trained.stderr
    out = project / "out"
    assert (out / "config.yaml").is_file()
    assert list((out / "tb" / "train").glob("events.out.tfevents.*"))
    train = read_jsonl(out / "metrics" / "train.jsonl")
    valid = read_jsonl(out / "metrics" / "valid.jsonl")
    assert [row["step"] for row in train] == list(range(10, 151, 10))
    assert [row["step"] for row in valid] == [50, 100, 150]
    assert train[-1]["loss"] < train[0]["loss"] / 10
    # The targets' noise has variance 0.01; a fitted line gets close to it.
    assert valid[-1]["mse"] < 0.05


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
