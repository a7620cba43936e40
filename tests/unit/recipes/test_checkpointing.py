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
from recipes.checkpointing.run_checkpoints import changed_keys, checkpoint_policy, find_resume_checkpoint
from recipes.cli.job import resolve_job
from recipes.cli.job_spec import JobSpec
from recipes.config.resolution import ConfigError, to_dict


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


def test_the_dtype_of_sparse_tables_rows_is_not_a_changed_key() -> None:
    """Loading converts the rows (and says so: ``embedding.collection``), as it moves them to another device."""
    saved = {"model": {"embeddings": {"dtype": "float32", "tables": {}}, "dtype": "float32"}}
    changed = {
        "model": {"embeddings": {"dtype": "float16", "tables": {"item": {"dtype": "bfloat16"}}}, "dtype": "int8"}
    }

    assert changed_keys(saved, changed) == ["model.dtype"]


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


def test_a_policy_of_an_unresolved_direction_refuses_to_rank_scored_checkpoints(root: str) -> None:
    """A preset's `trainer.lower_better` is unset where its metric says the direction; read as false (higher is
    better), `eval PRESET OUTPUT_DIR --checkpoint best` of a run scored by a loss loaded its highest loss."""
    writer = CheckpointManager(root, FakeGang())
    for step, loss in ((10, 0.5), (20, 0.7)):
        writer.save(step, {"trainer": {"step_nr": step}}, score=loss)
    unresolved = resolved("trainer.score_metric=log_loss")
    assert unresolved.trainer.lower_better is None

    with pytest.raises(RuntimeError, match=r"^Scored checkpoints must be ranked by the direction of the score's"):
        CheckpointManager(root, FakeGang(), checkpoint_policy(unresolved), clean_up=False).best_step()

    by_loss = resolved("trainer.score_metric=log_loss", "trainer.lower_better=true")
    assert CheckpointManager(root, FakeGang(), checkpoint_policy(by_loss), clean_up=False).best_step() == 10


def test_a_policy_of_an_unresolved_direction_keeps_unscored_checkpoints_as_any_policy_does(root: str) -> None:
    """A run without a score metric records `lower_better` unset: its checkpoints have no score to rank."""
    manager = CheckpointManager(root, FakeGang(), checkpoint_policy(resolved("checkpoint.keep_best_n=null")))
    for step in (10, 20, 30):
        manager.save(step, {"trainer": {"step_nr": step}})

    assert manager.best_step() is None
    assert [info.step for info in manager.list_checkpoints()] == [30]  # ctr_tiny keeps the last one.


def saved_with_direction(root: str, lower_better: bool | None) -> CheckpointManager:
    """A manager of one checkpoint, of step 10, saved by a run whose `trainer.lower_better` was ``lower_better``."""
    manager = CheckpointManager(root, FakeGang())
    config = to_dict(resolved(f"trainer.lower_better={json.dumps(lower_better)}"))
    manager.save(10, {"trainer": {"step_nr": 10}}, extras={"config": config})
    return manager


@pytest.mark.parametrize(("saved", "configured"), [(True, None), (True, True), (False, None), (None, True)])
def test_a_resume_may_leave_lower_better_unset_or_as_saved(
    root: str, saved: bool | None, configured: bool | None
) -> None:
    loaded = find_resume_checkpoint(
        saved_with_direction(root, saved), resolved(f"trainer.lower_better={json.dumps(configured)}")
    )

    assert loaded is not None and loaded.step == 10


@pytest.mark.parametrize(("saved", "configured"), [(True, False), (False, True)])
def test_a_resume_that_flips_lower_better_is_refused_naming_both_values(
    root: str, saved: bool, configured: bool
) -> None:
    """For a metric that does not say its direction (a `Mean`), the flip was taken without a word: the best score,
    early stopping's memory and keep-best then compared the other way."""
    with pytest.raises(ConfigError) as raised:
        find_resume_checkpoint(
            saved_with_direction(root, saved), resolved(f"trainer.lower_better={str(configured).lower()}")
        )

    assert str(raised.value) == (
        f"`trainer.lower_better` must stay {str(saved).lower()} to resume from the checkpoint of step 10, but is "
        f"{str(configured).lower()} instead: its best score, early stopping and kept checkpoints were ranked the "
        "other way. Use a new output directory, or set checkpoint.start_over=true to train from scratch."
    )
