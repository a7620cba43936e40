"""Where ``predict -o`` and ``importance -o`` may write: never over a file the run reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from recipes.errors import UserError
from recipes.training.predictions import refuse_overwriting_inputs


@dataclass
class Dataset:
    train_path: str
    test_path: str
    joins: list[dict[str, str]] = field(default_factory=list)


@dataclass
class Config:
    dataset: Dataset


def test_an_output_naming_a_file_the_run_reads_is_refused_with_the_key_that_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = Config(
        Dataset(str(tmp_path / "train.csv"), "test.csv", joins=[{"path": "file://" + str(tmp_path / "j.csv")}])
    )

    with pytest.raises(
        UserError, match=r"^`-o` must not name a file the run reads, but test.csv is its `dataset.test_path`"
    ):
        refuse_overwriting_inputs("test.csv", config)
    with pytest.raises(UserError, match=r"is its `dataset.train_path`"):
        refuse_overwriting_inputs(f"{tmp_path}/sub/../train.csv", config)
    with pytest.raises(UserError, match=r"is its `dataset.joins.0.path`"):
        refuse_overwriting_inputs(str(tmp_path / "j.csv"), config)


def test_an_output_beside_the_inputs_is_fine(tmp_path: Path) -> None:
    config = Config(Dataset(str(tmp_path / "train.csv"), str(tmp_path / "test.csv")))

    refuse_overwriting_inputs(str(tmp_path / "predictions.csv"), config)
    refuse_overwriting_inputs("memory://test.csv", config)
