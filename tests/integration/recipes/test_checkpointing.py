"""Checkpoints as a user meets them through the CLI: keep policies in ``python -m recipes checkpoints``,
model-only saves, corrupted or planted files, ``init_from``, asynchronous saves and a disk that fills up
(GitHub issue 3)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import subprocess
from pathlib import Path

import fsspec
import pytest
import torch

from recipes.cli.main import main
from support.cli_runs import checkpoints_listing, printed_by_main
from support.resume_helpers import (
    FINAL_STEP,
    assert_bitwise_equal,
    assert_same_training,
    check_ok,
    checkpoints_dir,
    committed_steps,
    copy_run,
    error_line,
    load_shared_verified,
    load_verified,
    load_weights_only,
    metric_history,
    read_metadata,
    run_recipes,
    shared_run,
    train_args,
)

KEEP_ALL = ("checkpoint.keep_last_n=null", "checkpoint.keep_best_n=null")


@pytest.fixture
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_run(tmp_path_factory, "reference")


@pytest.fixture(scope="module")
def kept_all(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run that keeps every checkpoint: steps 10, 20, 30 and 40."""
    return shared_run(tmp_path_factory, "kept_all", *KEEP_ALL)


def checkpoint_rows(output_dir: Path) -> dict[int, str]:
    """The rows of ``python -m recipes checkpoints``, by step."""
    header, *rows = checkpoints_listing(output_dir).splitlines()
    assert header.split() == ["step", "score", "size", "resumable", "kept", "by"]
    return {int(row.split()[0]): row for row in rows}


# Keep policies ----------------------------------------------------------------------------------


def test_the_checkpoints_command_shows_what_each_policy_keeps_and_the_best(tmp_path: Path) -> None:
    output_dir = tmp_path / "run"
    policies = ("checkpoint.keep_last_n=1", "checkpoint.keep_best_n=1", "checkpoint.keep_every_n_steps=20")
    check_ok(run_recipes(tmp_path, *train_args(output_dir, "trainer.validate_every_n_steps=10", *policies)))

    aucs = {line["step"]: line["auc"] for line in metric_history(output_dir)["valid"]}
    assert sorted(aucs) == [10, 20, 30, 40]
    best = max(sorted(aucs), key=lambda step: aucs[step])  # The earlier step wins a tie.
    assert committed_steps(output_dir) == sorted({20, 40, best})

    rows = checkpoint_rows(output_dir)
    assert sorted(rows) == committed_steps(output_dir)
    for step, row in rows.items():
        metadata = read_metadata(checkpoints_dir(output_dir) / f"step_{step}")
        assert metadata.score == aucs[step]
        expected_rules = {"keep_last_n", "newest", "newest_resumable"} if step == 40 else set()
        expected_rules |= {"keep_every_n_steps"} if step % 20 == 0 else set()
        expected_rules |= {"keep_best_n"} if step == best else set()
        kept_by = row.split("yes", 1)[1].replace("<- best", "")
        assert set(re.findall(r"[a-z_]+", kept_by)) == expected_rules, row
        assert f"{metadata.score:.6g}" in row and f"{metadata.size_bytes / 1e6:.1f} MB" in row
        assert row.endswith("<- best") == (step == best), row


def test_model_only_all_but_last_leaves_only_the_last_checkpoint_resumable(tmp_path: Path) -> None:
    output_dir = tmp_path / "run"
    overrides = (*KEEP_ALL, "checkpoint.model_only=all_but_last", "trainer.max_num_steps=35")
    check_ok(run_recipes(tmp_path, *train_args(output_dir, *overrides)))

    rows = checkpoint_rows(output_dir)
    assert sorted(rows) == [10, 20, 30, 35]
    assert [rows[step].split()[4] for step in sorted(rows)] == ["no", "no", "no", "yes"]
    for step in (10, 20, 30):
        step_dir = checkpoints_dir(output_dir) / f"step_{step}"
        assert set(load_shared_verified(step_dir)) == {"model"}
        for file_name in set(read_metadata(step_dir).files) - {"model.pt"}:
            assert not {"data_reader", "rng"} & set(load_verified(step_dir, file_name)), file_name
    last_dir = checkpoints_dir(output_dir) / "step_35"
    assert {"optimizer", "trainer"} <= set(load_shared_verified(last_dir))


def test_model_only_all_but_last_keeps_the_final_checkpoint_resumable_on_a_periodic_step(tmp_path: Path) -> None:
    output_dir = tmp_path / "run"
    check_ok(run_recipes(tmp_path, *train_args(output_dir, *KEEP_ALL, "checkpoint.model_only=all_but_last")))

    assert read_metadata(checkpoints_dir(output_dir) / f"step_{FINAL_STEP}").resumable


# Damaged and planted checkpoints --------------------------------------------------------------


def damage_checkpoint(step_dir: Path, damage: str) -> None:
    """Do to a checkpoint what a failing disk, a person or an interrupted copy would."""
    if damage == "flip_byte":
        data = bytearray((step_dir / "model.pt").read_bytes())
        data[len(data) // 2] ^= 0xFF  # Same size: only the checksum can tell.
        (step_dir / "model.pt").write_bytes(data)
    elif damage == "truncate_model":
        (step_dir / "model.pt").write_bytes((step_dir / "model.pt").read_bytes()[:1000])
    elif damage == "delete_rank_file":
        (step_dir / "rank_0.pt").unlink()
    elif damage == "delete_metadata":
        (step_dir / "metadata.json").unlink()
    else:
        (step_dir / "metadata.json").write_text('{"step": 40, "files": ')


def directory_contents(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir()}


@pytest.mark.parametrize(
    "damage",
    [
        "flip_byte",
        "delete_metadata",
        "garble_metadata",
        "truncate_model",
        "delete_rank_file",
    ],
)
def test_a_damaged_last_checkpoint_is_moved_aside_and_the_previous_one_resumed_bitwise(
    tmp_path: Path, kept_all: Path, damage: str
) -> None:
    output_dir = copy_run(kept_all, tmp_path / "run")
    last = checkpoints_dir(output_dir) / f"step_{FINAL_STEP}"
    damage_checkpoint(last, damage)
    damaged_files = directory_contents(last)

    result = check_ok(run_recipes(tmp_path, *train_args(output_dir, *KEEP_ALL)))

    moved = checkpoints_dir(output_dir) / f"step_{FINAL_STEP}.damaged"
    kept = directory_contents(moved)
    why = kept.pop("why_damaged.txt").decode().strip()
    assert kept == damaged_files  # Never deleted, never rewritten.
    lines = [line for line in result.stderr.splitlines() if "damaged" in line]
    assert len(lines) == 1, result.stderr
    assert f"Moved the damaged checkpoint {last} aside to step_{FINAL_STEP}.damaged" in lines[0] and why in lines[0]
    assert "Resumed from the checkpoint of step 30." in (output_dir / "logs" / "rank_0.log").read_text()
    assert committed_steps(output_dir) == [10, 20, 30, 40]
    assert_same_training(kept_all, output_dir, FINAL_STEP)
    listing = checkpoints_listing(output_dir).splitlines()
    damaged_rows = [row for row in listing if "DAMAGED" in row]
    assert len(damaged_rows) == 1 and damaged_rows[0].split()[0] == str(FINAL_STEP), listing
    assert f"moved aside to step_{FINAL_STEP}.damaged): {why}" in damaged_rows[0]


class _RunsCode:
    """Unpickling this runs ``touch MARKER``: what a planted checkpoint would do to a full-pickle load."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def planted_pickle_run(
    tmp_path_factory: pytest.TempPathFactory, kept_all: Path
) -> tuple[Path, Path, subprocess.CompletedProcess[str]]:
    """A re-run over a last checkpoint whose ``model.pt`` was replaced by a code-running pickle, with its
    SHA-256 and size recomputed in ``metadata.json`` so that only the weights-only load stands in the way."""
    tmp_path = tmp_path_factory.mktemp("planted")
    output_dir = copy_run(kept_all, tmp_path / "run")
    marker = tmp_path / "code_ran"
    step_dir = checkpoints_dir(output_dir) / f"step_{FINAL_STEP}"
    torch.save({"model": _RunsCode(marker)}, step_dir / "model.pt")
    # Check that the planted file does run code when loaded without weights_only, then undo it.
    torch.load(step_dir / "model.pt", weights_only=False)
    assert marker.exists()
    marker.unlink()
    data = (step_dir / "model.pt").read_bytes()
    metadata = json.loads((step_dir / "metadata.json").read_text())
    metadata["files"]["model.pt"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (step_dir / "metadata.json").write_text(json.dumps(metadata))
    result = run_recipes(tmp_path, *train_args(output_dir, *KEEP_ALL, "trainer.max_num_steps=50"))
    return output_dir, marker, result


def test_a_planted_pickle_is_refused_without_running_it(
    planted_pickle_run: tuple[Path, Path, subprocess.CompletedProcess[str]],
) -> None:
    output_dir, marker, result = planted_pickle_run
    assert not marker.exists()
    assert result.returncode != 0
    line = error_line(result)
    assert "weights-only load refuses" in line and "model.pt" in line
    assert "weights_only=False" not in line
    assert str(checkpoints_dir(output_dir) / f"step_{FINAL_STEP}" / "model.pt") in line
    assert committed_steps(output_dir) == [10, 20, 30, 40]


def test_a_planted_pickle_is_a_user_error_with_exit_2_and_one_line(
    planted_pickle_run: tuple[Path, Path, subprocess.CompletedProcess[str]],
) -> None:
    _, _, result = planted_pickle_run
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr, result.stderr


# Sparse tables in model-only checkpoints, eval and init_from ------------------------------------

DENSE_TABLES = "model.embeddings.backend=dense"
TABLE_SHAPE = (200, 16)  # dataset.vocab_size x model.embeddings.dim, four tables.


@pytest.fixture(scope="module")
def dense_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run whose tables are ``nn.EmbeddingBag``s, so that the model state holds them."""
    return shared_run(tmp_path_factory, "dense", *KEEP_ALL, DENSE_TABLES)


def tensor_shapes(step_dir: Path) -> list[tuple[int, ...]]:
    """The shapes of every tensor in every file of a checkpoint."""
    shapes: list[tuple[int, ...]] = []

    def collect(value: object) -> None:
        if isinstance(value, torch.Tensor):
            shapes.append(tuple(value.shape))
        elif isinstance(value, dict):
            for item in value.values():
                collect(item)
        elif isinstance(value, list | tuple):
            for item in value:
                collect(item)

    for file_name in read_metadata(step_dir).files:
        collect(load_verified(step_dir, file_name))
    return shapes


def test_a_model_only_checkpoint_holds_the_sparse_tables(tmp_path: Path) -> None:
    output_dir = tmp_path / "run"
    check_ok(run_recipes(tmp_path, *train_args(output_dir, "checkpoint.model_only=all", "trainer.max_num_steps=10")))

    assert tensor_shapes(checkpoints_dir(output_dir) / "step_10").count(TABLE_SHAPE) == 4


def evaluated_auc(capsys: pytest.CaptureFixture[str], output_dir: Path, *overrides: str) -> float:
    printed = printed_by_main(capsys, "eval", *train_args(output_dir, *overrides)[1:], "--checkpoint", "best")
    (line,) = [line for line in printed.splitlines() if line.startswith("valid: ")]
    return float(re.search(r"auc=(\S+)", line).group(1))  # type: ignore[union-attr]


def best_recorded_auc(output_dir: Path) -> float:
    return max(float(line["auc"]) for line in metric_history(output_dir)["valid"])


def test_eval_of_the_best_checkpoint_reproduces_its_recorded_score(
    dense_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    auc = evaluated_auc(capsys, dense_run, *KEEP_ALL, DENSE_TABLES)

    assert auc == pytest.approx(best_recorded_auc(dense_run), abs=1e-5)


def test_eval_of_the_best_checkpoint_with_sparse_tables_reproduces_its_recorded_score(
    tmp_path: Path, kept_all: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output_dir = copy_run(kept_all, tmp_path / "run")  # eval records its own metrics: the shared run stays as trained

    auc = evaluated_auc(capsys, output_dir, *KEEP_ALL)

    assert auc == pytest.approx(best_recorded_auc(output_dir), abs=1e-5)


def test_init_from_copies_the_included_parameters_and_leaves_the_excluded(tmp_path: Path, dense_run: Path) -> None:
    output_dir = tmp_path / "run"
    # One step with a vanishing lr: the parameters stay where initialisation put them, to 1e-7.
    overrides = (
        DENSE_TABLES,
        f"checkpoint.init_from={checkpoints_dir(dense_run)}",
        "checkpoint.init_exclude=[mlp.*]",
        "optimizer.lr=1.0e-9",
        "trainer.max_num_steps=1",
    )
    check_ok(run_recipes(tmp_path, *train_args(output_dir, *overrides)))

    source = load_weights_only(checkpoints_dir(dense_run) / f"step_{FINAL_STEP}" / "model.pt")["model"]
    started = load_weights_only(checkpoints_dir(output_dir) / "step_1" / "model.pt")["model"]
    tables = [name for name in source if name.startswith("embeddings.")]
    mlp = [name for name in source if name.startswith("mlp.")]
    assert len(tables) == 4 and mlp
    for name in tables:
        torch.testing.assert_close(started[name], source[name], rtol=0, atol=1e-7, msg=name)
    for name in mlp:  # Freshly initialised: far from the trained head.
        assert (started[name] - source[name]).abs().max() > 1e-3, name


def test_init_from_copies_sparse_tables(tmp_path: Path, kept_all: Path) -> None:
    output_dir = tmp_path / "run"
    overrides = (
        f"checkpoint.init_from={checkpoints_dir(kept_all)}",
        "checkpoint.init_exclude=[mlp.*]",
        "optimizer.lr=1.0e-9",
        "model.embeddings.sparse_optimizer.lr=1.0e-9",
        "trainer.max_num_steps=1",
    )
    check_ok(run_recipes(tmp_path, *train_args(output_dir, *overrides)))

    source = load_weights_only(checkpoints_dir(kept_all) / f"step_{FINAL_STEP}" / "rank_0.pt")["sharded"]
    started = load_weights_only(checkpoints_dir(output_dir) / "step_1" / "rank_0.pt")["sharded"]
    for name, table in source["embeddings"]["tables"].items():
        torch.testing.assert_close(
            started["embeddings"]["tables"][name]["weight"], table["weight"], rtol=0, atol=1e-7, msg=name
        )


@pytest.fixture(scope="module")
def mismatched_init_run(tmp_path_factory: pytest.TempPathFactory, dense_run: Path) -> subprocess.CompletedProcess[str]:
    tmp_path = tmp_path_factory.mktemp("mismatch")
    overrides = (DENSE_TABLES, f"checkpoint.init_from={checkpoints_dir(dense_run)}", "model.embeddings.dim=8")
    return run_recipes(tmp_path, *train_args(tmp_path / "run", *overrides))


def test_init_from_a_model_of_other_shapes_names_the_mismatch(
    mismatched_init_run: subprocess.CompletedProcess[str],
) -> None:
    assert mismatched_init_run.returncode != 0
    line = error_line(mismatched_init_run)
    assert "other shapes" in line and "embeddings.bags.cat_0.weight (200, 16) vs (200, 8)" in line


def test_init_from_a_model_of_other_shapes_is_a_user_error_with_exit_2(
    mismatched_init_run: subprocess.CompletedProcess[str],
) -> None:
    assert mismatched_init_run.returncode == 2
    assert "Traceback" not in mismatched_init_run.stderr


# Asynchronous saves ---------------------------------------------------------------------------


def test_async_save_trains_and_saves_exactly_what_a_blocking_save_does(tmp_path: Path, reference: Path) -> None:
    output_dir = tmp_path / "run"
    check_ok(run_recipes(tmp_path, *train_args(output_dir, "checkpoint.async_save=true")))

    assert_same_training(reference, output_dir, FINAL_STEP)
    assert sorted(committed_steps(output_dir)) == sorted(committed_steps(reference))
    for step in committed_steps(output_dir):
        for name in read_metadata(checkpoints_dir(reference) / f"step_{step}").files:
            left = load_weights_only(checkpoints_dir(reference) / f"step_{step}" / name)
            right = load_verified(checkpoints_dir(output_dir) / f"step_{step}", name)
            left.get("metrics", {}).pop("throughput", None)
            right.get("metrics", {}).pop("throughput", None)
            assert_bitwise_equal(left, right, f"step_{step}/{name}")


# Failed saves --------------------------------------------------------------------------------


@pytest.mark.parametrize("async_save", [False, True], ids=["blocking", "async"])
def test_a_full_disk_while_saving_ends_the_run_with_exit_1_one_line_and_the_previous_checkpoint_intact(
    tmp_path: Path,
    isolated_presets: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    async_save: bool,
) -> None:
    """The save of step 20 meets a full disk (in the background with ``async_save``, surfacing at the
    save of step 30); the run stops there, in the training process, with the same one line."""
    output_dir = tmp_path / "run"
    fs = fsspec.filesystem("file")  # fsspec caches instances: the checkpoint manager's is this one.
    original_open = fs.open

    def open_on_a_full_disk(path: str, mode: str = "rb", **kwargs: object) -> object:
        if "w" in mode and "/step_20.tmp-" in path and path.endswith(".pt"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return original_open(path, mode, **kwargs)

    monkeypatch.setattr(fs, "open", open_on_a_full_disk)
    overrides = ("trainer.max_num_steps=30", f"checkpoint.async_save={str(async_save).lower()}", *KEEP_ALL)

    code = main(train_args(output_dir, *overrides))

    stderr = capsys.readouterr().err
    monkeypatch.undo()
    assert code == 1, stderr
    assert "Traceback" not in stderr and "unexpected pos" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, stderr
    assert re.fullmatch(
        r"error: CheckpointWriteError: Could not save the checkpoint of step 20: writing "
        + re.escape(str(checkpoints_dir(output_dir)))
        + r"/step_20\.tmp-[0-9a-f]+/\S+\.pt failed with \[Errno 28\] No space left on device "
        r"\(free space there: [\d.]+ [KMGT]?B\)\. "
        r"The earlier checkpoints are intact, and no part of step 20 is visible\.",
        errors[0],
    ), errors[0]
    assert sorted(p.name for p in checkpoints_dir(output_dir).iterdir()) == ["step_10"]
    assert set(load_shared_verified(checkpoints_dir(output_dir) / "step_10")) >= {"model", "optimizer", "trainer"}
