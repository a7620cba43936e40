"""Resume, end to end: a run killed with ``kill -9`` anywhere, even inside a checkpoint save, and run
again with the same command, ends exactly as if it had never been interrupted (GitHub issue 3).

"Exactly" means bit for bit: model, optimizer, scheduler, data position, RNG and pending metric
state of the final checkpoint, every metric line, and TensorBoard curves that never double back.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from recipes.cli.job import list_checkpoints
from support.resume_helpers import (
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

KEEP_ALL = ("checkpoint.keep_last_n=null", "checkpoint.keep_best_n=null")


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


# Metrics of interrupted runs ------------------------------------------------------------------


def test_a_torn_last_metrics_line_is_dropped_and_the_run_resumes_without_duplicates(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Killed after the checkpoint of step 30 while writing the metrics line of step 36: the line is cut
    short, and the checkpoint of step 40 never came."""
    kept_all = shared_run(tmp_path_factory, "kept_all", *KEEP_ALL)
    output_dir = copy_run(kept_all, tmp_path / "run")
    shutil.rmtree(checkpoints_dir(output_dir) / f"step_{FINAL_STEP}")
    train_jsonl = output_dir / "metrics" / "train.jsonl"
    text = train_jsonl.read_text()
    torn_at = text.index('{"step": 36') + 20
    train_jsonl.write_text(text[:torn_at])

    result = check_ok(run_recipes(tmp_path, *train_args(output_dir, *KEEP_ALL)))

    lines = [line for line in result.stderr.splitlines() if "torn" in line]
    assert len(lines) == 1 and str(train_jsonl) in lines[0], result.stderr
    assert "Resumed from the checkpoint of step 30." in (output_dir / "logs" / "rank_0.log").read_text()
    assert_same_training(kept_all, output_dir, FINAL_STEP)  # Every line parses, each step once.


def test_a_run_killed_before_its_first_checkpoint_starts_afresh_recording_no_step_twice(
    tmp_path: Path, reference: Path
) -> None:
    output_dir = tmp_path / "run"
    marker = tmp_path / "stalled"
    process = start_recipes(tmp_path, *train_args(output_dir), env=stall_env("mid_file", 10, marker), stalling=True)
    wait_and_kill_at_stall(process, marker)
    assert committed_steps(output_dir) == []
    assert [line["step"] for line in metric_history(output_dir)["train"]] == [4, 8]

    result = check_ok(run_recipes(tmp_path, *train_args(output_dir)))

    lines = [line for line in result.stderr.splitlines() if "Training starts from step 0" in line]
    assert len(lines) == 1 and "metrics.old-1/" in lines[0] and "tb.old-1/" in lines[0], result.stderr
    assert_same_training(reference, output_dir, FINAL_STEP)  # Curves and lines each hold every step once.
    # What the killed run recorded is kept aside, whole.
    old_lines = (output_dir / "metrics.old-1" / "train.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in old_lines] == [4, 8]
    old_events = EventAccumulator(str(output_dir / "tb.old-1" / "train"))
    old_events.Reload()
    assert [event.step for event in old_events.Scalars("loss")] == [4, 8]
