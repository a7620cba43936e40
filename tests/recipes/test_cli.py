"""`python -m recipes`: commands, help, exit codes and one-line errors; one real training of ctr_tiny."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from recipes.cli import main
from recipes.job import JobSpec, resolve_job

COMMANDS = ["list", "show", "train", "eval", "checkpoints"]


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(err: str, *fragments: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def scalars(log_dir: Path, tag: str) -> list[tuple[int, float]]:
    """A scalar series as TensorBoard itself reads it back."""
    events = EventAccumulator(str(log_dir))
    events.Reload()
    return [(event.step, event.value) for event in events.Scalars(tag)]


# One real training, shared by the tests that read its output ----------------------------------


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory, run_cli: Any) -> Iterator[tuple[Path, Any, float]]:
    """``python -m recipes train ctr_tiny -o DIR`` as shipped (300 steps): the DIR, the process, its wall time."""
    cwd = tmp_path_factory.mktemp("cli")
    start = time.perf_counter()
    result = run_cli("train", "ctr_tiny", "-o", "run", cwd=cwd)
    yield cwd / "run", result, time.perf_counter() - start


def test_train_ctr_tiny_finishes_and_says_where_its_logs_are(trained_run: tuple[Path, Any, float]) -> None:
    output_dir, result, wall_time_s = trained_run

    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "TensorBoard logs: run/tb" in result.stdout
    assert wall_time_s < 120  # A sanity bound only: it takes seconds.
    assert (output_dir / "config.yaml").is_file()
    assert (output_dir / "logs" / "rank_0.log").is_file()


def test_tensorboard_holds_the_train_loss_and_a_valid_auc_well_above_chance(
    trained_run: tuple[Path, Any, float],
) -> None:
    output_dir = trained_run[0]

    loss = scalars(output_dir / "tb" / "train", "loss")
    auc = scalars(output_dir / "tb" / "valid", "auc")

    assert [step for step, _ in loss] == list(range(10, 301, 10))
    assert loss[-1][1] < loss[0][1]
    assert [step for step, _ in auc] == [100, 200, 300]
    assert auc[-1][1] > 0.8  # The recipe reaches about 0.88; chance is 0.5.


def test_jsonl_holds_one_object_per_published_step(trained_run: tuple[Path, Any, float], read_jsonl: Any) -> None:
    metrics_dir = trained_run[0] / "metrics"

    train = read_jsonl(metrics_dir / "train.jsonl")
    valid = read_jsonl(metrics_dir / "valid.jsonl")

    assert [row["step"] for row in train] == list(range(10, 301, 10))
    assert {"loss", "throughput", "lr", "accuracy"} <= set(train[0])
    assert [row["step"] for row in valid] == [100, 200, 300]
    assert {"auc", "log_loss", "accuracy"} <= set(valid[0])


def test_the_written_config_resolves_to_the_same_config(
    trained_run: tuple[Path, Any, float], isolated_presets: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_path = str(trained_run[0] / "config.yaml")
    original = resolve_job(JobSpec("ctr_tiny")).config

    assert resolve_job(JobSpec(config_path)).config == original
    assert resolve_job(JobSpec("ctr_tiny", config_files=[config_path])).config == original
    code, out, _ = run_main(capsys, "show", config_path)
    assert code == 0
    assert yaml.safe_load(out) == yaml.safe_load(Path(config_path).read_text())


def test_train_from_the_written_config_file(
    trained_run: tuple[Path, Any, float], isolated_presets: Path, capsys: pytest.CaptureFixture[str], read_jsonl: Any
) -> None:
    config_path = str(trained_run[0] / "config.yaml")

    code, _, err = run_main(
        capsys, "train", config_path, "-o", "again", "trainer.max_num_steps=4", "metrics.recorders.console=false"
    )

    assert code == 0, err
    assert [row["step"] for row in read_jsonl(isolated_presets / "again" / "metrics" / "train.jsonl")] == [4]
    again = yaml.safe_load((isolated_presets / "again" / "config.yaml").read_text())
    assert again["config"]["trainer"]["max_num_steps"] == 4
    assert again["config"]["optimizer"] == yaml.safe_load(Path(config_path).read_text())["config"]["optimizer"]


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
    ],
)
def test_a_user_error_exits_2_with_one_line(
    argv: list[str], fragments: list[str], isolated_presets: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (isolated_presets / "malformed.yaml").write_text("optimizer: [lr: 1\n")

    code, _, err = run_main(capsys, *argv)

    assert code == 2
    assert_one_line_error(err, *fragments)


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


# Real processes: what the user's shell sees ---------------------------------------------------

BOOM_PY = """\
import torch

from recsys.builtin.ctr.recipe import CTRConfig, build_ctr
from recipes.registry import register_recipe
from units import TrainUnit


class BoomUnit(TrainUnit[object]):
    def __call__(self, batch: object) -> tuple[torch.Tensor, int]:
        raise RuntimeError("the unit failed on purpose")


@register_recipe("boom", CTRConfig)
def build_boom(context):
    parts = build_ctr(context)
    parts.train_unit = BoomUnit(parts.train_unit.model, parts.train_unit.metric_bag)
    return parts
"""


@pytest.fixture(scope="module")
def failed_run(tmp_path_factory: pytest.TempPathFactory, run_cli: Any) -> Any:
    """A user's recipe whose unit raises a RuntimeError, trained in a real process."""
    cwd = tmp_path_factory.mktemp("boom")
    (cwd / "boom.py").write_text(BOOM_PY)
    (cwd / "recipes.yaml").write_text("boom:\n  recipe: boom\n  imports: [boom]\n")
    return run_cli("train", "boom", "-o", "out", "metrics.recorders.console=false", cwd=cwd)


def test_a_runtime_failure_exits_1_naming_the_cause(failed_run: Any) -> None:
    assert failed_run.returncode == 1
    assert failed_run.stderr.strip().splitlines()[-1] == "error: RuntimeError: the unit failed on purpose"


def test_a_runtime_failure_prints_one_line_and_no_traceback(failed_run: Any) -> None:
    assert_one_line_error(failed_run.stderr, "RuntimeError: the unit failed on purpose")


def test_a_user_error_in_a_real_process_exits_2_with_one_line(tmp_path: Path, run_cli: Any) -> None:
    result = run_cli("train", "ctr_tinny", cwd=tmp_path)

    assert result.returncode == 2
    assert_one_line_error(result.stderr, "Unknown preset 'ctr_tinny'. Did you mean 'ctr_tiny'")
    assert result.stdout == ""


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
        ("optimizer.lr=inf", "`optimizer.lr` must be a finite number > 0, but is inf instead"),
        ("optimizer.lr=.nan", "`optimizer.lr` must be a finite number > 0, but is nan instead"),
        ("trainer.early_stopping.min_delta=nan", "`trainer.early_stopping.min_delta` must be a finite number >= 0"),
        (
            "optimizer.learning_rate=0.1",
            "Unknown config key 'optimizer.learning_rate' for optimizer 'adamw' (from the command line). "
            "Did you mean 'optimizer.lr'?",
        ),
    ],
)
def test_a_bad_value_is_refused_with_one_line_before_anything_is_written(
    override: str, fragment: str, isolated_presets: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_main(capsys, "train", "ctr_tiny", "-o", "out", override)

    assert code == 2
    assert_one_line_error(err, fragment)
    assert not (isolated_presets / "out").exists()


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
from recipes.registry import register_recipe


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

    monkeypatch.setattr("recipes.run.Trainer.run", vanish)

    code, _, err = run_main(capsys, "train", "ctr_tiny", "-o", "out", "metrics.recorders.console=false")

    assert code == 1
    assert_one_line_error(err, "FileNotFoundError")


def test_a_users_module_named_like_a_framework_package_is_refused_in_one_line(tmp_path: Path, run_cli: Any) -> None:
    (tmp_path / "units.py").write_text("MY_UNITS = 1\n")
    (tmp_path / "recipes.yaml").write_text("mine:\n  recipe: ctr\n")

    result = run_cli("show", "mine", cwd=tmp_path)

    assert result.returncode == 2
    assert_one_line_error(result.stderr, f"{tmp_path / 'units.py'} hides the framework's package `units`", "rename it")


MY_RECIPE_PY = """\
from dataclasses import dataclass

from recsys.builtin.ctr.recipe import CTRConfig, build_ctr
from recipes.registry import register_recipe


@dataclass
class MyConfig(CTRConfig):
    my_knob: int = 1


register_recipe("my_ctr", MyConfig)(build_ctr)
"""


def test_a_users_written_config_reruns_from_another_directory(
    isolated_presets: Path, run_cli: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    project, elsewhere = isolated_presets / "project", isolated_presets / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    (project / "my_recipe_py.py").write_text(MY_RECIPE_PY)
    (project / "mine.yaml").write_text("recipe: my_ctr\nimports: [my_recipe_py]\nconfig: {my_knob: 7}\n")
    monkeypatch.chdir(project)
    code, out, _ = run_main(capsys, "show", "mine.yaml")
    assert code == 0
    (elsewhere / "config.yaml").write_text(out)  # What `train` writes to OUTPUT_DIR/config.yaml.

    result = run_cli("show", "config.yaml", cwd=elsewhere)

    assert result.returncode == 0, result.stderr
    document = yaml.safe_load(result.stdout)
    assert (document["recipe"], document["config"]["my_knob"]) == ("my_ctr", 7)
    assert document["search_path"] == [str(project.resolve())]
