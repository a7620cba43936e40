"""A user's own recipe checked at start-up (GitHub issue 45): what the framework asks of it that it ignores, or a
unit that cannot score, stops ``python -m recipes train`` in one line, before the first step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from support.cli_runs import assert_one_line_error
from support.paths import ROOT


@pytest.mark.parametrize(
    ("override", "line"),
    [
        ("metrics.group_by=user", "`metrics.group_by` is 'user', but no metric of the recipe's eval units groups"),
        ("metrics.slice_by=hour", "`metrics.slice_by` is 'hour', but no metric of the recipe's eval units slices"),
        ("trainer.lower_better=null", "`trainer.lower_better` must be set for `trainer.score_metric: valid/mse`"),
    ],
    ids=["group_by", "slice_by", "no_direction"],
)
def test_a_users_recipe_that_cannot_honour_the_config_stops_before_its_first_step(
    tmp_path: Path, run_cli: Any, override: str, line: str
) -> None:
    """The tutorial's linear regression has its own eval unit: no metric groups or slices, and its `mse` is a Mean,
    which does not say which way is better."""
    output_dir = tmp_path / "run"

    result = run_cli("train", "linreg_demo", "-o", str(output_dir), override, cwd=ROOT)

    assert result.returncode == 2, result.stderr
    assert_one_line_error(result.stderr, line)
    assert not (output_dir / "checkpoints").exists() or not any((output_dir / "checkpoints").iterdir())
