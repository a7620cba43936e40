"""The checkout's own ``recipes.yaml``, run in the checkout as a user would: ``python -m recipes list`` shows the
tutorials' presets beside the built-in ones, and each of them trains from there.

``tests/unit/recipes/test_examples.py`` checks that the tutorials' pages, the example folders and these presets
agree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from support.paths import ROOT
from support.resume_helpers import committed_steps

CHECKOUT_PRESETS = yaml.safe_load((ROOT / "recipes.yaml").read_text())
# Short enough for seconds, long enough to validate and checkpoint twice.
SHORT_RUN = (
    "trainer.max_num_steps=4",
    "trainer.validate_every_n_steps=2",
    "trainer.publish_metrics_every_n_steps=2",
    "checkpoint.every_n_steps=2",
    "metrics.recorders.console=false",
)


def test_list_in_the_checkout_shows_the_tutorials_presets_beside_the_built_in_ones(run_cli: Any) -> None:
    result = run_cli("list", cwd=ROOT)

    assert result.returncode == 0, result.stderr
    listed = {line.split()[0]: line.split()[1] for line in result.stdout.splitlines() if line.strip()}
    assert listed["ctr_tiny"] == "ctr"
    assert {name: listed.get(name) for name in CHECKOUT_PRESETS} == {
        name: preset["recipe"] for name, preset in CHECKOUT_PRESETS.items()
    }


@pytest.mark.parametrize("preset", sorted(CHECKOUT_PRESETS))
def test_each_of_the_checkouts_presets_trains_from_the_checkout(
    preset: str, tmp_path: Path, run_cli: Any, read_jsonl: Any
) -> None:
    out = tmp_path / "out"

    result = run_cli("train", preset, "-o", str(out), *SHORT_RUN, cwd=ROOT)

    assert result.returncode == 0, result.stderr
    recorded = yaml.safe_load((out / "config.yaml").read_text())
    declared = CHECKOUT_PRESETS[preset]
    assert recorded["imports"] == declared["imports"]
    assert recorded["search_path"] == [str((ROOT / folder).resolve()) for folder in declared["search_path"]]
    assert [row["step"] for row in read_jsonl(out / "metrics" / "train.jsonl")] == [2, 4]
    assert [row["step"] for row in read_jsonl(out / "metrics" / "valid.jsonl")] == [2, 4]
    assert committed_steps(out) == [2, 4]
