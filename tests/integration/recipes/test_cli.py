"""``python -m recipes`` as a user's shell runs it: one real training of ctr_tiny and what it writes, a user's
recipe that fails, and one-line errors of real processes."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from recipes.cli.job import resolve_job
from recipes.cli.job_spec import JobSpec
from support.cli_runs import assert_one_line_error, run_main


def scalars(log_dir: Path, tag: str) -> list[tuple[int, float]]:
    """A scalar series as TensorBoard itself reads it back."""
    events = EventAccumulator(str(log_dir))
    events.Reload()
    return [(event.step, event.value) for event in events.Scalars(tag)]


# One real training, shared by the tests that read its output ----------------------------------


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory, run_cli: Any) -> tuple[Path, Any]:
    """``python -m recipes train ctr_tiny -o DIR`` as shipped (300 steps): the DIR and the process, which took
    seconds (``run_cli`` fails one that takes minutes)."""
    cwd = tmp_path_factory.mktemp("cli")
    return cwd / "run", run_cli("train", "ctr_tiny", "-o", "run", cwd=cwd)


def test_train_ctr_tiny_finishes_and_says_where_its_logs_are(trained_run: tuple[Path, Any]) -> None:
    output_dir, result = trained_run

    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "TensorBoard logs: run/tb" in result.stdout
    assert (output_dir / "config.yaml").is_file()
    assert (output_dir / "logs" / "rank_0.log").is_file()


def test_tensorboard_holds_the_train_loss_and_a_valid_auc_well_above_chance(
    trained_run: tuple[Path, Any],
) -> None:
    output_dir = trained_run[0]

    loss = scalars(output_dir / "tb" / "train", "loss")
    auc = scalars(output_dir / "tb" / "valid", "auc")

    assert [step for step, _ in loss] == list(range(10, 301, 10))
    assert loss[-1][1] < loss[0][1]
    assert [step for step, _ in auc] == [100, 200, 300]
    assert auc[-1][1] > 0.8  # The recipe reaches about 0.88; chance is 0.5.


def test_jsonl_holds_one_object_per_published_step(trained_run: tuple[Path, Any], read_jsonl: Any) -> None:
    metrics_dir = trained_run[0] / "metrics"

    train = read_jsonl(metrics_dir / "train.jsonl")
    valid = read_jsonl(metrics_dir / "valid.jsonl")

    assert [row["step"] for row in train] == list(range(10, 301, 10))
    assert {"loss", "throughput", "lr", "accuracy"} <= set(train[0])
    assert [row["step"] for row in valid] == [100, 200, 300]
    assert {"auc", "log_loss", "accuracy"} <= set(valid[0])


def test_the_written_config_resolves_to_the_same_config(
    trained_run: tuple[Path, Any], isolated_presets: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_path = str(trained_run[0] / "config.yaml")
    preset = resolve_job(JobSpec("ctr_tiny")).config
    # The preset's config, with the direction of its score as its metric (an AUC) says.
    assert preset.trainer.score_metric == "auc" and preset.trainer.lower_better is None
    original = dataclasses.replace(preset, trainer=dataclasses.replace(preset.trainer, lower_better=False))

    assert resolve_job(JobSpec(config_path)).config == original
    assert resolve_job(JobSpec("ctr_tiny", config_files=[config_path])).config == original
    code, out, _ = run_main(capsys, "show", config_path)
    assert code == 0
    assert yaml.safe_load(out) == yaml.safe_load(Path(config_path).read_text())


def test_train_from_the_written_config_file(
    trained_run: tuple[Path, Any], isolated_presets: Path, capsys: pytest.CaptureFixture[str], read_jsonl: Any
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


# Real processes: what the user's shell sees ---------------------------------------------------

BOOM_PY = """\
import torch

from recsys.builtin.ctr.recipe import CTRConfig, build_ctr
from recipes.config.presets import register_recipe
from units import TrainUnit


class BoomUnit(TrainUnit[object]):
    def __call__(self, batch: object) -> torch.Tensor:
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


def test_a_users_module_named_like_a_framework_package_is_refused_in_one_line(tmp_path: Path, run_cli: Any) -> None:
    (tmp_path / "units.py").write_text("MY_UNITS = 1\n")
    (tmp_path / "recipes.yaml").write_text("mine:\n  recipe: ctr\n")

    result = run_cli("show", "mine", cwd=tmp_path)

    assert result.returncode == 2
    assert_one_line_error(result.stderr, f"{tmp_path / 'units.py'} hides the framework's package `units`", "rename it")


@pytest.mark.parametrize(
    "users_module",
    [
        'import pathlib\npathlib.Path("user_file_ran").touch()\n',  # a helper: `train` once exited 0, doing nothing
        "from recipes import register_recipe\n",  # a recipe module: once Python's circular-import traceback
    ],
)
def test_python_dash_m_recipes_beside_a_users_recipes_py_is_refused_before_it_runs(
    tmp_path: Path, run_cli: Any, users_module: str
) -> None:
    """`-m` finds the current folder's recipes.py before the framework; the guard that setup.py installs in
    site-packages runs at the interpreter's start-up, before that lookup."""
    (tmp_path / "recipes.py").write_text(users_module)
    (tmp_path / "recipes.yaml").write_text("mine:\n  recipe: ctr\n")

    result = run_cli("train", "mine", "-o", "out", cwd=tmp_path)

    assert result.returncode == 2
    assert_one_line_error(result.stderr, f"{tmp_path / 'recipes.py'} hides the framework's package `recipes`")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["recipes.py", "recipes.yaml"]


EARLY_FAILURE_PY = """\
from dataclasses import dataclass

from recsys.builtin.ctr.recipe import CTRConfig, build_ctr
from recipes.config.presets import register_recipe


@dataclass
class EarlyConfig(CTRConfig):
    def __post_init__(self) -> None:
        raise RuntimeError("the config failed on purpose")


register_recipe("early", EarlyConfig)(build_ctr)
"""


def test_a_failure_before_logging_is_set_up_prints_one_line_and_no_traceback(tmp_path: Path, run_cli: Any) -> None:
    """Once Python's last-resort handler printed "The job failed." and the traceback before the line."""
    (tmp_path / "early.py").write_text(EARLY_FAILURE_PY)
    (tmp_path / "recipes.yaml").write_text("early:\n  recipe: early\n  imports: [early]\n")

    result = run_cli("train", "early", "-o", "out", cwd=tmp_path)

    assert result.returncode == 1
    assert result.stderr == "error: RuntimeError: the config failed on purpose\n"


AT_EXIT_PY = """\
import atexit
import pathlib

atexit.register(pathlib.Path("teardown_ran").touch)
"""


def test_a_finished_train_exits_0_without_the_interpreters_teardown(tmp_path: Path, run_cli: Any) -> None:
    """The teardown destroyed native threads, which sometimes aborted a finished run ('terminate called without an
    active exception', SIGABRT, exit 1 after "Done."); an exit hook a module registered shows whether it ran."""
    (tmp_path / "at_exit.py").write_text(AT_EXIT_PY)
    (tmp_path / "recipes.yaml").write_text("mine:\n  recipe: ctr\n  imports: [at_exit]\n")
    args = ["-o", "out", "trainer.max_num_steps=2", "metrics.recorders.console=false"]

    trained = run_cli("train", "mine", *args, cwd=tmp_path)
    finished = run_cli("train", "mine", *args, cwd=tmp_path)  # A finished run: nothing left to train.

    for result in (trained, finished):
        assert result.returncode == 0, result.stderr
        assert "Done. TensorBoard logs: out/tb" in result.stdout
    assert "Resumed from the checkpoint of step 2." in (tmp_path / "out" / "logs" / "rank_0.log").read_text()
    assert not (tmp_path / "teardown_ran").exists()


MY_RECIPE_PY = """\
from dataclasses import dataclass

from recsys.builtin.ctr.recipe import CTRConfig, build_ctr
from recipes.config.presets import register_recipe


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
