"""What a resume compares in a checkpoint's config: a list saved as JSON, or how the host runs a step, is no changed
key; a decaying LR schedule's horizon stays, and the run may not stop before the checkpoint's step. Checkpoints as a
user meets them through the CLI are tests/integration/recipes/test_checkpointing.py's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from checkpoint import CheckpointManager
from gang import FakeGang
from recipes import RecipeConfig
from recipes.checkpointing import changed_keys, find_resume_checkpoint
from recipes.config import ConfigError, to_dict
from recipes.job import resolve_job
from recipes.job_spec import JobSpec


@pytest.fixture
def root(tmp_path: Path) -> str:
    return str(tmp_path / "checkpoints")


def test_a_list_of_groups_saved_as_json_is_not_a_changed_key() -> None:
    current = {"dataset": {"groups": [{"columns": ["a"], "vocabulary": True, "min_count": 2}], "lr": 0.1}}
    saved = json.loads(json.dumps(current, sort_keys=True))  # as a checkpoint's metadata holds it

    assert changed_keys(saved, current) == []
    assert changed_keys(saved, {"dataset": {**current["dataset"], "lr": 0.2}}) == ["dataset.lr"]


def test_how_the_host_runs_a_step_is_not_a_changed_key() -> None:
    saved = {
        "trainer": {"pipeline": True, "keep_freed_memory": True, "device": "cuda", "nan_policy": "stop"},
        "dataset": {"parse_threads": 1},
    }

    changed = {
        "trainer": {"pipeline": False, "keep_freed_memory": False, "device": "cpu", "nan_policy": "skip"},
        "dataset": {"parse_threads": None},
    }

    assert changed_keys(saved, changed) == ["trainer.nan_policy"]


def resolved(*overrides: str) -> RecipeConfig:
    return resolve_job(JobSpec("ctr_tiny", overrides=list(overrides))).config


@pytest.mark.parametrize(
    ("schedule", "max_steps", "message"),
    [
        (
            "cosine",
            40,
            "`trainer.max_num_steps` must stay 20 to resume this run, but is 40 instead: `lr_scheduler.name: cosine` "
            "decays the learning rate over it, so the rate would jump at the resumed step. Use checkpoint.init_from "
            "in a new output directory to train on longer.",
        ),
        (
            "constant",
            5,
            "`trainer.max_num_steps` must be at least 10, the step of the checkpoint the run resumes from, but is 5 "
            "instead: nothing would train.",
        ),
    ],
    ids=["a_longer_decaying_schedule", "fewer_steps_than_the_checkpoint"],
)
def test_a_resume_that_would_move_a_decaying_schedule_or_stop_before_its_step_is_refused(
    root: str, schedule: str, max_steps: int, message: str
) -> None:
    """Once, the cosine rate jumped from 0.52 to 0.86 of its base at the resumed step, and fewer steps than the
    checkpoint's did nothing and said nothing."""
    saved = resolved(f"lr_scheduler.name={schedule}", "trainer.max_num_steps=20")
    manager = CheckpointManager(root, FakeGang())
    manager.save(10, {"trainer": {"step_nr": 10}}, extras={"config": to_dict(saved)})

    with pytest.raises(ConfigError) as raised:
        find_resume_checkpoint(manager, resolved(f"lr_scheduler.name={schedule}", f"trainer.max_num_steps={max_steps}"))

    assert str(raised.value) == message


def test_a_resume_may_train_on_longer_under_a_schedule_that_does_not_decay(root: str) -> None:
    saved = resolved("trainer.max_num_steps=20")
    manager = CheckpointManager(root, FakeGang())
    manager.save(10, {"trainer": {"step_nr": 10}}, extras={"config": to_dict(saved)})

    loaded = find_resume_checkpoint(manager, resolved("trainer.max_num_steps=40"))

    assert loaded is not None and loaded.step == 10
