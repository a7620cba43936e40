"""Which checkpoint `eval`/`predict`/`importance PRESET OUTPUT_DIR` load: ranked by the run's own direction, read
from its config.yaml (the preset's `trainer.lower_better` may be unset). End to end:
tests/integration/recipes/test_score_direction.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from recipes.cli.job_spec import JobSpec
from recipes.cli.scoring import score
from recipes.errors import UserError


def test_a_preset_with_an_output_directory_of_no_run_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    output_dir = tmp_path / "not_a_run"

    with pytest.raises(UserError) as raised:
        score(JobSpec("ctr_tiny", str(output_dir)), "best")

    assert str(raised.value) == f"{output_dir} is not a run's output directory: it has no config.yaml."
    assert not output_dir.exists()
