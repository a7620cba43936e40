"""What a resume compares in a checkpoint's config: a list saved as JSON, or how the host runs a step, is no changed
key. Checkpoints as a user meets them through the CLI are tests/integration/recipes/test_checkpointing.py's."""

from __future__ import annotations

import json

from recipes.checkpointing import changed_keys


def test_a_list_of_groups_saved_as_json_is_not_a_changed_key() -> None:
    current = {"dataset": {"groups": [{"columns": ["a"], "vocabulary": True, "min_count": 2}], "lr": 0.1}}
    saved = json.loads(json.dumps(current, sort_keys=True))  # as a checkpoint's metadata holds it

    assert changed_keys(saved, current) == []
    assert changed_keys(saved, {"dataset": {**current["dataset"], "lr": 0.2}}) == ["dataset.lr"]


def test_how_the_host_runs_a_step_is_not_a_changed_key() -> None:
    saved = {"trainer": {"pipeline": True, "keep_freed_memory": True, "nan_policy": "stop"}}

    changed = {"trainer": {"pipeline": False, "keep_freed_memory": False, "nan_policy": "skip"}}

    assert changed_keys(saved, changed) == ["trainer.nan_policy"]
