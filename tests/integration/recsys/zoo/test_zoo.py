"""The CTR model zoo through the framework: every model by name, on either backend, trains, validates and
checkpoints as ``python -m recipes train`` runs it."""

from __future__ import annotations

from pathlib import Path

import pytest

from recipes.cli.main import main
from support.zoo_data import ZOO_MODEL_NAMES, Backend


@pytest.mark.parametrize(("name", "backend"), [*((name, "sparse") for name in ZOO_MODEL_NAMES), ("deepfm", "dense")])
def test_every_model_trains_validates_and_checkpoints_through_the_framework(
    zoo_recipe: Path, capsys: pytest.CaptureFixture[str], name: str, backend: Backend
) -> None:
    code = main(["train", "zoo_test", "-o", "out", f"model.name={name}", f"model.embeddings.backend={backend}"])

    out = capsys.readouterr().out
    assert code == 0
    assert (zoo_recipe / "out/checkpoints/step_6/metadata.json").is_file()
    if backend == "sparse":
        if name == "wide_deep":  # its two parts each hold their tables
            assert "sparse table 'a' (model.deep.embeddings)" in out
            assert "sparse table 'first_order_a' (model.wide.first_order): 20 rows x 1" in out
        else:
            assert "sparse table 'a' (model.embeddings)" in out or name == "logistic_regression"
        if name in ("logistic_regression", "fm", "deepfm"):
            assert "sparse table 'first_order_a' (model.first_order): 20 rows x 1" in out
