"""The first tutorial (docs/tutorials/your-own-model.md): a user's own recipe in a folder of their own, listed and
trained with ``python -m recipes``. Its folder is ``examples/my_project`` copied out of the checkout (its files are
the page's: tests/unit/recipes/test_examples.py checks it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from support.doc_tutorials import copy_example


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
