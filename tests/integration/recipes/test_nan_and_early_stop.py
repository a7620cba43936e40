"""How a run ends early, end to end: early stopping on a score that stopped improving, and a NaN loss
under ``trainer.nan_policy`` stop or skip. Each leaves a checkpoint a user can go on from."""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from support.paths import NAN_RECIPE
from support.resume_helpers import (
    check_ok,
    checkpoints_dir,
    committed_steps,
    error_line,
    load_shared_verified,
    load_verified,
    metric_history,
    read_metadata,
    run_recipes,
    train_args,
)

# Patience 1 and a min_delta no AUC can beat: the second validation (step 20) stops the run,
# whatever the scores are.
EARLY_STOPPING = (
    "trainer.max_num_steps=100",
    "trainer.validate_every_n_steps=10",
    "trainer.early_stopping.patience=1",
    "trainer.early_stopping.min_delta=1.0",
)


@pytest.fixture(scope="module")
def early_stopped_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp_path = tmp_path_factory.mktemp("early_stop")
    output_dir = tmp_path / "run"
    check_ok(run_recipes(tmp_path, *train_args(output_dir, *EARLY_STOPPING)))
    return output_dir


def test_early_stopping_ends_the_run_at_the_validation_that_ran_out_of_patience(early_stopped_run: Path) -> None:
    history = metric_history(early_stopped_run)
    assert [line["step"] for line in history["valid"]] == [10, 20]
    assert history["train"][-1]["step"] == 20
    assert "Early stopping at step 20" in (early_stopped_run / "logs" / "rank_0.log").read_text()
    assert committed_steps(early_stopped_run)[-1] == 20
    last = checkpoints_dir(early_stopped_run) / "step_20"
    assert read_metadata(last).resumable
    assert load_verified(last, "early_stopper.pt")["early_stopper"] == {
        "best": history["valid"][0]["auc"],
        "num_bad": 1,
    }


def test_rerunning_an_early_stopped_run_trains_no_further(tmp_path: Path, early_stopped_run: Path) -> None:
    output_dir = tmp_path / "run"
    shutil.copytree(early_stopped_run, output_dir)

    check_ok(run_recipes(tmp_path, *train_args(output_dir, *EARLY_STOPPING)))

    assert committed_steps(output_dir)[-1] == 20


# NaN losses, from a user recipe whose loss is NaN at chosen steps -------------------------------


def train_nan_recipe(tmp_path: Path, *overrides: str) -> tuple[Path, subprocess.CompletedProcess[str]]:
    shutil.copy(NAN_RECIPE, tmp_path / "nan_recipe.py")
    (tmp_path / "recipes.yaml").write_text("nan_ctr:\n  recipe: nan_ctr\n  imports: [nan_recipe]\n")
    output_dir = tmp_path / "run"
    return output_dir, run_recipes(tmp_path, *train_args(output_dir, *overrides, preset="nan_ctr"))


def test_a_nan_loss_under_policy_stop_exits_1_naming_the_step_and_keeps_the_last_good_checkpoint(
    tmp_path: Path,
) -> None:
    output_dir, result = train_nan_recipe(tmp_path, "nan.at_steps=[15]", "trainer.nan_policy=stop")

    assert result.returncode == 1
    line = error_line(result)
    assert "The loss is nan at step 15" in line and "trainer.nan_policy=skip" in line
    assert committed_steps(output_dir) == [10]
    step_dir = checkpoints_dir(output_dir) / "step_10"
    shared = load_shared_verified(step_dir)
    assert shared["trainer"]["step_nr"] == 10
    assert all(torch.isfinite(value).all() for value in shared["model"].values())
    assert isinstance(load_verified(step_dir, "rank_0.pt"), dict)


def test_nan_losses_under_policy_skip_are_counted_and_training_goes_on(tmp_path: Path) -> None:
    overrides = ("nan.at_steps=[13, 14]", "trainer.nan_policy=skip", "trainer.max_num_steps=24")
    output_dir, result = train_nan_recipe(tmp_path, *overrides)

    check_ok(result)
    assert "The loss is nan at step 13; the step is skipped." in result.stderr
    train = {line["step"]: line for line in metric_history(output_dir)["train"]}
    assert sorted(train) == [4, 8, 12, 16, 20, 24]
    # Steps 13-16 are published together: 2 of their 4 steps were skipped.
    assert [train[step]["num_skipped_steps"] for step in sorted(train)] == [0.0, 0.0, 0.0, 0.5, 0.0, 0.0]
    assert all(math.isfinite(line["loss"]) for line in train.values())
    final = checkpoints_dir(output_dir) / "step_24"
    for file_name in ("model.pt", "optimizer.pt", "rank_0.pt"):
        state = load_verified(final, file_name)
        tensors = [v for v in _tensors(state) if v.is_floating_point()]
        assert tensors and all(torch.isfinite(t).all() for t in tensors), file_name


def test_a_nan_loss_on_one_rank_skips_the_step_on_every_rank(tmp_path: Path) -> None:
    """The ranks agree on a step's finiteness in their gradient sync (``training.parallel.StepSums``): the rank whose
    loss is finite skips the step too, so the replicas stay equal."""
    overrides = (
        "nan.at_steps=[13]",
        "nan.rank=1",
        "trainer.nan_policy=skip",
        "trainer.max_num_steps=16",
        "--nproc",
        "2",
    )
    output_dir, result = train_nan_recipe(tmp_path, *overrides)

    check_ok(result)
    train = {line["step"]: line for line in metric_history(output_dir)["train"]}
    assert train[16]["num_skipped_steps"] == 0.25 and all(math.isfinite(line["loss"]) for line in train.values())
    final = checkpoints_dir(output_dir) / "step_16"
    model = load_shared_verified(final)["model"]
    assert all(torch.isfinite(value).all() for value in model.values())
    for file_name in ("rank_0.pt", "rank_1.pt"):
        tensors = [v for v in _tensors(load_verified(final, file_name)) if v.is_floating_point()]
        assert tensors and all(torch.isfinite(t).all() for t in tensors), file_name


def test_too_many_nan_losses_in_a_row_under_policy_skip_stop_the_run(tmp_path: Path) -> None:
    overrides = ("nan.at_steps=[13, 14, 15, 16]", "trainer.nan_policy=skip", "trainer.max_consecutive_skipped_steps=3")
    output_dir, result = train_nan_recipe(tmp_path, *overrides)

    assert result.returncode == 1
    assert "The loss was not finite for 3 steps in a row (up to step 15); stopping." in error_line(result)
    assert committed_steps(output_dir) == [10]


def _tensors(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _tensors(item)]
    if isinstance(value, list | tuple):
        return [t for item in value for t in _tensors(item)]
    return []
