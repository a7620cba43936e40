"""Resume, end to end: a run killed with ``kill -9`` anywhere, even inside a checkpoint save, and run
again with the same command, ends exactly as if it had never been interrupted (GitHub issue 3).

"Exactly" means bit for bit: model, optimizer, scheduler, data position, RNG and pending metric
state of the final checkpoint, every metric line, and TensorBoard curves that never double back.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from resume_helpers import (
    FINAL_STEP,
    assert_same_training,
    check_ok,
    checkpoints_dir,
    committed_steps,
    copy_run,
    kill_hard,
    load_verified,
    metric_history,
    one_line_error,
    read_metadata,
    run_recipes,
    shared_run,
    stall_env,
    start_recipes,
    step_dirs,
    tensorboard_scalars,
    train_args,
    wait_and_kill_at_stall,
    wait_for_checkpoint,
)

from recipes.run import list_checkpoints


@pytest.fixture
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run every interrupted one must match."""
    return shared_run(tmp_path_factory, "reference")


def assert_no_half_checkpoint_is_visible(output_dir: Path) -> None:
    """Each ``step_N`` directory with a metadata file loads whole, and the manager lists exactly those."""
    committed = committed_steps(output_dir)
    for step in committed:
        step_dir = checkpoints_dir(output_dir) / f"step_{step}"
        for file_name in read_metadata(step_dir).files:
            assert isinstance(load_verified(step_dir, file_name), dict)
    assert [info.step for info in list_checkpoints(str(output_dir))] == committed


def assert_only_committed_checkpoints_are_left(output_dir: Path) -> None:
    """No temporary, replaced or uncommitted directory survives a finished run."""
    names = sorted(p.name for p in checkpoints_dir(output_dir).iterdir())
    assert names == sorted(p.name for p in step_dirs(output_dir)), names
    assert [f"step_{s}" for s in committed_steps(output_dir)] == sorted(names, key=lambda n: int(n[5:]))


def test_a_run_killed_twice_and_rerun_ends_bitwise_equal_to_an_uninterrupted_one(
    tmp_path: Path, reference: Path
) -> None:
    output_dir = tmp_path / "run"
    for first_checkpoint_to_see in (10, 30):
        process = start_recipes(tmp_path, *train_args(output_dir))
        wait_for_checkpoint(output_dir, first_checkpoint_to_see, process)
        kill_hard(process)
        assert_no_half_checkpoint_is_visible(output_dir)

    check_ok(run_recipes(tmp_path, *train_args(output_dir)))

    assert "Resumed from the checkpoint of step" in (output_dir / "logs" / "rank_0.log").read_text()
    assert_same_training(reference, output_dir, FINAL_STEP)
    assert_only_committed_checkpoints_are_left(output_dir)


@pytest.mark.slow
@pytest.mark.parametrize("point", ["mid_file", "before_rename", "mid_prune"])
def test_a_run_killed_inside_a_save_shows_no_half_checkpoint_and_resumes_bitwise_equal(
    tmp_path: Path, reference: Path, point: str
) -> None:
    output_dir = tmp_path / "run"
    marker = tmp_path / "stalled"
    process = start_recipes(tmp_path, *train_args(output_dir), env=stall_env(point, 20, marker), stalling=True)
    wait_and_kill_at_stall(process, marker)

    names = [p.name for p in checkpoints_dir(output_dir).iterdir()]
    if point == "mid_prune":
        # The save of step 20 is committed; step 10, which no policy keeps, lost its metadata first.
        assert committed_steps(output_dir) == [20]
        assert "step_10" in names
    else:
        assert committed_steps(output_dir) == [10]
        assert any(name.startswith("step_20.tmp-") for name in names), names
    assert_no_half_checkpoint_is_visible(output_dir)

    check_ok(run_recipes(tmp_path, *train_args(output_dir)))

    assert_same_training(reference, output_dir, FINAL_STEP)
    assert_only_committed_checkpoints_are_left(output_dir)


# Config changes on resume ---------------------------------------------------------------------


def test_a_changed_lr_is_refused_with_one_line_naming_the_key(tmp_path: Path, reference: Path) -> None:
    output_dir = copy_run(reference, tmp_path / "run")
    before = sorted(p.name for p in checkpoints_dir(output_dir).iterdir())

    result = run_recipes(tmp_path, *train_args(output_dir, "optimizer.lr=0.01"))

    assert result.returncode == 2
    line = one_line_error(result)
    assert "optimizer.lr" in line and f"step {FINAL_STEP}" in line and "checkpoint.start_over=true" in line
    assert sorted(p.name for p in checkpoints_dir(output_dir).iterdir()) == before


def test_a_refused_config_leaves_the_runs_config_yaml_as_it_was(tmp_path: Path, reference: Path) -> None:
    output_dir = copy_run(reference, tmp_path / "run")
    config_before = (output_dir / "config.yaml").read_text()

    result = run_recipes(tmp_path, *train_args(output_dir, "optimizer.lr=0.01"))

    assert result.returncode == 2
    assert yaml.safe_load((output_dir / "config.yaml").read_text())["config"]["optimizer"]["lr"] == 0.003
    assert (output_dir / "config.yaml").read_text() == config_before


def test_a_larger_max_num_steps_continues_the_run(tmp_path: Path, reference: Path) -> None:
    output_dir = copy_run(reference, tmp_path / "run")

    check_ok(run_recipes(tmp_path, *train_args(output_dir, "trainer.max_num_steps=48")))

    assert f"Resumed from the checkpoint of step {FINAL_STEP}." in (output_dir / "logs" / "rank_0.log").read_text()
    assert committed_steps(output_dir)[-1] == 48
    train_lines = metric_history(output_dir)["train"]
    assert train_lines[: FINAL_STEP // 4] == metric_history(reference)["train"]
    assert [line["step"] for line in train_lines] == list(range(4, 49, 4))
    assert [step for step, _ in tensorboard_scalars(output_dir, "train", "loss")] == list(range(4, 49, 4))


def test_start_over_trains_from_scratch_and_moves_the_old_checkpoints_aside(tmp_path: Path, reference: Path) -> None:
    output_dir = copy_run(reference, tmp_path / "run")
    old_steps = committed_steps(output_dir)

    check_ok(run_recipes(tmp_path, *train_args(output_dir, "checkpoint.start_over=true", "trainer.max_num_steps=20")))

    archived = [p for p in output_dir.iterdir() if p.name.startswith("checkpoints.old-")]
    assert len(archived) == 1
    assert sorted(p.name for p in archived[0].iterdir()) == sorted(f"step_{s}" for s in old_steps)
    assert committed_steps(output_dir)[-1] == 20
    assert "Training starts at step 0 " in (output_dir / "logs" / "rank_0.log").read_text()
    # The same first 20 steps as the first run, and nothing of its later steps left in the history.
    reference_train = metric_history(reference)["train"]
    assert metric_history(output_dir)["train"] == reference_train[:5]
    assert tensorboard_scalars(output_dir, "train", "loss") == tensorboard_scalars(reference, "train", "loss")[:5]
