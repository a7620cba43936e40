"""``python -m recipes`` in this process: commands, help, exit codes and one-line errors, all before any training.
Real processes and a real training: tests/integration/recipes/test_cli.py."""

from __future__ import annotations

import builtins
import errno
import io
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from fsspec.implementations.local import LocalFileSystem

from recipes.cli.main import main
from support.cli_runs import assert_one_line_error, run_main

COMMANDS = ["list", "show", "train", "eval", "checkpoints"]


# Commands in-process -----------------------------------------------------------------------------


def test_list_shows_every_preset_with_its_recipe_and_description(
    isolated_presets: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_main(capsys, "list")

    assert code == 0
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert {"ctr_tiny", "ctr_tiny_long"} <= set(lines)
    assert "ctr" in lines["ctr_tiny"] and "Small CTR model" in lines["ctr_tiny"]
    assert "(from ctr_tiny)" in lines["ctr_tiny_long"]


def test_show_prints_the_resolved_config_with_overrides_applied(
    isolated_presets: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (isolated_presets / "extra.yaml").write_text("optimizer:\n  weight_decay: 0.25\n")

    code, out, _ = run_main(
        capsys,
        "show",
        "ctr_tiny_long",
        "optimizer.lr=0.5",
        "--config",
        "trainer.max_grad_norm=2",
        "--config-file",
        "extra.yaml",
        "model.hidden_dims=[8, 4]",
    )

    assert code == 0
    document = yaml.safe_load(out)
    assert document["recipe"] == "ctr"
    config = document["config"]
    assert config["optimizer"]["lr"] == 0.5
    assert config["optimizer"]["weight_decay"] == 0.25
    assert config["trainer"]["max_grad_norm"] == 2.0
    assert config["model"]["hidden_dims"] == [8, 4]
    assert config["trainer"]["max_num_steps"] == 2000  # from ctr_tiny_long
    assert config["trainer"]["score_metric"] == "auc"  # inherited from ctr_tiny
    assert config["lr_scheduler"]["name"] == "cosine"


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_of_every_command_exits_0(command: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--help"] if command is None else [command, "--help"]

    with pytest.raises(SystemExit) as info:
        main(argv)

    assert info.value.code == 0
    assert "usage: recipes" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (["show", "ctr_tinny"], ["Unknown preset 'ctr_tinny'", "'ctr_tiny'", "python -m recipes list"]),
        (["show", "ctr_tiny", "traner.max_num_steps=3"], ["Unknown config key 'traner'", "Did you mean 'trainer'?"]),
        (
            ["show", "ctr_tiny", "trainer.max_num_step=3"],
            ["'trainer.max_num_step'", "Did you mean 'trainer.max_num_steps'?"],
        ),
        (["show", "ctr_tiny", "trainer.max_num_steps=many"], ["'trainer.max_num_steps' must be int or null"]),
        (
            ["show", "ctr_tiny", "trainer.grad_accumulation=0"],
            ["`trainer.grad_accumulation` must be an integer >= 1, but is 0 instead"],
        ),
        (["show", "ctr_tiny", "--config-file", "missing.yaml"], ["The config file missing.yaml does not exist"]),
        (["show", "ctr_tiny", "--config-file", "malformed.yaml"], ["malformed.yaml is not valid YAML"]),
        (["show", "ctr_tiny", "trainer.max_num_steps=[1"], ["is not valid YAML"]),
        (["show", "ctr_tiny", "max_num_steps"], ["Overrides must look like `section.key=value`"]),
        (["show", "ctr_tiny", "=3"], ["must look like `section.key=value`"]),
        (["show", "ctr_tiny", "--config", "trainer.max_num_steps"], ["must look like `section.key=value`"]),
        (["show", "ctr_tiny", "--bogus"], ["unrecognized arguments: --bogus"]),
        (["train", "ctr_tiny", "a", "b"], ["Give one output directory"]),
        (["train"], ["the following arguments are required: preset"]),
        (["fly"], ["invalid choice: 'fly'"]),
        (["show", "missing/preset.yaml"], ["The preset file missing/preset.yaml does not exist"]),
        (["checkpoints", "nowhere"], ["nowhere is not a run's output directory"]),
        # Once trained into ./runs/ctr_tiny, possibly resuming an unrelated run there.
        (
            ["train", "ctr_tiny", "-o", "", "trainer.max_num_steps=1"],
            ["The output directory must be a path, but is empty"],
        ),
        # Once "The preset file nowhere/run does not exist".
        (
            ["eval", "nowhere/run"],
            ["nowhere/run must be a run's output directory (or a preset), but is not: it does not"],
        ),
        (["eval", "."], [". must be a run's output directory (or a preset), but is not: it has no config.yaml."]),
    ],
)
def test_a_user_error_exits_2_with_one_line(
    argv: list[str], fragments: list[str], isolated_presets: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (isolated_presets / "malformed.yaml").write_text("optimizer: [lr: 1\n")

    code, _, err = run_main(capsys, *argv)

    assert code == 2
    assert_one_line_error(err, *fragments)


@pytest.mark.parametrize(
    ("argv", "name"),
    [
        (["show", "ctr_tiny", "--config-file", "picture.bin"], "picture.bin"),
        (["show", "./picture.bin"], "picture.bin"),
        (["train", "picture.yaml"], "picture.yaml"),
    ],
)
def test_a_binary_file_as_config_or_preset_is_a_user_error_naming_it(
    argv: list[str], name: str, isolated_presets: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Once a UnicodeDecodeError naming no file, exit 1."""
    picture = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe"
    for file_name in ("picture.bin", "picture.yaml"):
        (isolated_presets / file_name).write_bytes(picture)

    code, _, err = run_main(capsys, *argv)

    assert code == 2
    assert_one_line_error(err, f"The file {name} must be YAML, which is UTF-8 text, but is not text")


@pytest.mark.parametrize(
    ("argv", "name"),
    [
        (["show", "ctr_tiny", "--config-file", "secret.yaml"], "secret.yaml"),
        (["show", "./secret.yaml"], "secret.yaml"),
        (["show", "ctr_tiny"], "recipes.yaml"),  # the presets of the working folder, read by every command
    ],
)
def test_a_config_or_preset_file_the_user_may_not_read_is_a_user_error_naming_it(
    argv: list[str],
    name: str,
    isolated_presets: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Once a PermissionError, exit 1. Tests run as root, whom ``chmod 000`` does not stop, so opening the file
    (by ``open`` or ``Path.open``) is refused as the OS refuses another user."""
    (isolated_presets / "secret.yaml").write_text("recipe: ctr\n")
    (isolated_presets / "recipes.yaml").write_text("mine:\n  recipe: ctr\n")
    real_open = io.open

    def refusing_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(file, (str, os.PathLike)) and Path(file).name == name:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", refusing_open)
    monkeypatch.setattr(io, "open", refusing_open)

    code, _, err = run_main(capsys, *argv)

    assert code == 2
    assert_one_line_error(err, "The file ", f"{name} must be readable by this user, but is not (Permission denied).")


def test_a_malformed_recipes_yaml_in_the_current_directory_is_a_user_error(
    isolated_presets: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (isolated_presets / "recipes.yaml").write_text("mine:\n  recipe: ctr\n   config: {}\n")

    code, _, err = run_main(capsys, "list")

    assert code == 2
    assert_one_line_error(err, "recipes.yaml is not valid YAML")


def test_a_bad_score_metric_is_a_user_error_before_training(
    isolated_presets: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_main(capsys, "train", "ctr_tiny", "-o", "out", "trainer.score_metric=acu")

    assert code == 2
    assert "error: `trainer.score_metric` must name a validation metric (one of valid/auc, " in err
    assert "Traceback" not in err
    assert not (isolated_presets / "out" / "checkpoints").exists()


def test_a_bad_score_metric_prints_one_line(isolated_presets: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(capsys, "train", "ctr_tiny", "-o", "out", "trainer.score_metric=acu")

    assert code == 2
    assert_one_line_error(err, "`trainer.score_metric` must name a validation metric")


# Bad inputs found by trying them as a user would ------------------------------------------------


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("seed=-1", "`seed` must be an integer in [0, 4294967295], but is -1 instead (from the command line)."),
        ("model.hidden_dims=[-4]", "`model.hidden_dims[0]` must be an integer >= 1, but is -4 instead"),
        (
            "model.embeddings.sparse_optimizer.lr=-1",
            "`model.embeddings.sparse_optimizer.lr` must be a finite number >= 0, but is -1 instead",
        ),
        (
            "model.embeddings.sparse_optimizer.weight_decay_by_frequency=true",
            "`weight_decay` must be greater than 0 when `weight_decay_by_frequency` is set, but is 0 instead.",
        ),
        ("optimizer.lr=inf", "`optimizer.lr` must be a finite number > 0, but is inf instead"),
        ("optimizer.lr=.nan", "`optimizer.lr` must be a finite number > 0, but is nan instead"),
        ("trainer.early_stopping.min_delta=nan", "`trainer.early_stopping.min_delta` must be a finite number >= 0"),
        (
            "optimizer.learning_rate=0.1",
            "Unknown config key 'optimizer.learning_rate' for optimizer 'adamw' (from the command line). "
            "Did you mean 'optimizer.lr'?",
        ),
        # Once an OverflowError and its traceback, when the gang was set up.
        ("gang.timeout_s=1e300", "`gang.timeout_s` must be a finite number in (0, 2592000], but is 1e+300 instead"),
    ],
)
def test_a_bad_value_is_refused_with_one_line_before_anything_is_written(
    override: str, fragment: str, isolated_presets: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_main(capsys, "train", "ctr_tiny", "-o", "out", override)

    assert code == 2
    assert_one_line_error(err, fragment)
    assert not (isolated_presets / "out").exists()


def test_more_threads_per_rank_than_cores_is_refused_with_one_line_before_anything_is_written(
    isolated_presets: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Once death by SIGSEGV without a word, after the threads had exhausted the machine's processes."""
    code, _, err = run_main(capsys, "train", "ctr_tiny", "-o", "out", "gang.threads_per_rank=100000")

    assert code == 2
    assert_one_line_error(err, "`gang.threads_per_rank` must be at most the ", "but is 100000 instead.")
    assert not (isolated_presets / "out").exists()  # once an empty out/logs/rank_0.log, from after the run lock


def test_a_checkpoint_exclude_pattern_that_matches_nothing_is_refused(
    isolated_presets: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A misspelt name (``embedding`` for ``embeddings``) would keep in every checkpoint what it meant to leave out."""
    code, _, err = run_main(capsys, "train", "ctr_tiny", "-o", "out", "checkpoint.exclude=[embedding.*]")

    assert code == 2
    assert_one_line_error(
        err, "`checkpoint.exclude` pattern 'embedding.*' must match a parameter or table of the model, or name run"
    )
    assert not (isolated_presets / "out" / "checkpoints").exists()


@pytest.mark.parametrize("output", ["taken.txt", "taken.txt/run"])
def test_an_output_dir_that_is_a_file_is_refused_before_anything_is_written(
    output: str, isolated_presets: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (isolated_presets / "taken.txt").write_text("mine\n")

    code, _, err = run_main(capsys, "train", "ctr_tiny", "-o", output)

    assert code == 2
    assert_one_line_error(err, f"The output directory {output} must be a directory or not exist yet, but ")
    assert (isolated_presets / "taken.txt").read_text() == "mine\n"
    assert sorted(p.name for p in isolated_presets.iterdir()) == ["taken.txt"]


def test_an_output_dir_that_is_a_file_is_refused_before_launching_ranks(
    isolated_presets: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (isolated_presets / "taken.txt").write_text("mine\n")

    code, _, err = run_main(capsys, "train", "ctr_tiny", "-o", "taken.txt", "--nproc", "2")

    assert code == 2
    assert_one_line_error(err, "The output directory taken.txt must be a directory or not exist yet, but is a file.")


MISSING_DATA_PY = """\
import numpy as np

from recsys.builtin.ctr.recipe import CTRConfig, build_ctr
from recipes.config.presets import register_recipe


@register_recipe("reads_{name}", CTRConfig)
def build(context):
    {read}
    return build_ctr(context)
"""


@pytest.mark.parametrize(
    ("name", "read", "fragment"),
    [
        ("opens", "open('data/clicks.csv')", "could not build its parts: data/clicks.csv: No such file or directory."),
        (
            "loads",
            "np.loadtxt('data/clicks.csv')",
            "could not build its parts: FileNotFoundError: data/clicks.csv not found.",
        ),
        ("opens_dir", "open('.')", "could not build its parts: .: Is a directory."),
    ],
)
def test_a_user_recipe_missing_a_data_file_is_a_user_error(
    name: str, read: str, fragment: str, isolated_presets: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (isolated_presets / f"{name}.py").write_text(MISSING_DATA_PY.format(name=name, read=read))
    (isolated_presets / "recipes.yaml").write_text(f"mine:\n  recipe: reads_{name}\n  imports: [{name}]\n")

    code, _, err = run_main(capsys, "train", "mine", "-o", "out", "metrics.recorders.console=false")

    assert code == 2
    assert_one_line_error(err, f"Recipe 'reads_{name}' {fragment}")


def test_a_runtime_file_error_outside_the_build_stays_a_failure(
    isolated_presets: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def vanish(*args: object, **kwargs: object) -> None:
        raise FileNotFoundError(2, "No such file or directory", "somewhere/step_3")

    monkeypatch.setattr("recipes.cli.train.Trainer.run", vanish)

    code, _, err = run_main(capsys, "train", "ctr_tiny", "-o", "out", "metrics.recorders.console=false")

    assert code == 1
    assert_one_line_error(err, "FileNotFoundError")


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("model.hidden_dims=[1000000000000]", "(empty of shape [1000000000000, 68])"),
        ("dataset.vocab_size=100000000000000", "(arange of shape [100000000000000])"),
    ],
    ids=["hidden_dims", "vocab_size"],
)
def test_a_model_too_big_for_the_memory_is_refused_before_it_is_allocated(
    override: str, fragment: str, isolated_presets: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Once a raw allocator error (exit 1) or, where memory is overcommitted, the out-of-memory killer."""
    code, _, err = run_main(capsys, "train", "ctr_tiny", "-o", "out", "metrics.recorders.console=false", override)

    assert code == 2
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith("error: Building the model needs a tensor of ")
    assert fragment in line and "make the model smaller" in line
    assert not (isolated_presets / "out" / "checkpoints").exists()


def test_a_threads_uncaught_error_goes_to_the_log_not_the_terminal(
    isolated_presets: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Once a thread's traceback on the terminal (a TensorBoard writer's on a full disk), beside the one line."""
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)  # The CLI's hook, undone after the test.
    assert run_main(capsys, "list")[0] == 0

    def fail() -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    thread = threading.Thread(target=fail, name="writer")
    thread.start()
    thread.join()

    assert capsys.readouterr().err == ""
    assert "Thread writer failed: OSError: [Errno 28] No space left on device" in caplog.text


def test_a_full_disk_when_the_run_is_locked_is_a_runtime_failure_leaving_no_lock_file(
    isolated_presets: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once exit 2, a user's error, leaving an empty train.lock."""
    pwrite = os.pwrite

    def full(fd: int, data: bytes, offset: int) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("train.lock"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", full)

    code, _, err = run_main(capsys, "train", "ctr_tiny", "-o", "out", "metrics.recorders.console=false")

    assert code == 1
    assert_one_line_error(err, "error: WriteError: Could not write out/train.lock: [Errno 28] No space left on device.")
    assert os.listdir(isolated_presets / "out") == []


def test_a_full_disk_when_the_config_is_written_is_one_line_naming_the_file(
    isolated_presets: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once an OSError with its traceback, before training, naming no file."""
    opened = LocalFileSystem.open

    def full(fs: LocalFileSystem, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if "config.yaml" in path and "w" in mode:
            raise OSError(errno.ENOSPC, "No space left on device")
        return opened(fs, path, mode, **kwargs)

    monkeypatch.setattr(LocalFileSystem, "open", full)

    code, _, err = run_main(capsys, "train", "ctr_tiny", "-o", "out", "metrics.recorders.console=false")

    assert code == 1
    assert_one_line_error(
        err, "error: WriteError: Could not write out/config.yaml: [Errno 28] No space left on device."
    )
