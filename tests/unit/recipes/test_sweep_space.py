"""The sweep's space: ranges parsed and refused in one line, checked against the config before any trial runs, and
the command's misuse refused with exit code 2 before anything is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest

from recipes.cli.sweep_space import nested, parse_space, read_space_file, refuse_overridden
from recipes.errors import UserError
from support.cli_runs import assert_one_line_error, run_main


def test_each_kind_of_range_becomes_its_optuna_distribution() -> None:
    space = parse_space(
        {
            "optimizer.lr": {"log_uniform": [1.0e-4, 0.1]},
            "trainer.max_grad_norm": {"uniform": [0.5, 2]},
            "model.embeddings.dim": {"int": [8, 64], "step": 8},
            "optimizer.name": {"choice": ["adamw", "sgd"]},
        },
        "test",
    )

    distributions = space.distributions()

    assert distributions["optimizer.lr"] == optuna.distributions.FloatDistribution(1.0e-4, 0.1, log=True)
    assert distributions["trainer.max_grad_norm"] == optuna.distributions.FloatDistribution(0.5, 2.0)
    assert distributions["model.embeddings.dim"] == optuna.distributions.IntDistribution(8, 64, step=8)
    assert distributions["optimizer.name"] == optuna.distributions.CategoricalDistribution(["adamw", "sgd"])
    assert list(distributions) == ["optimizer.lr", "trainer.max_grad_norm", "model.embeddings.dim", "optimizer.name"]


@pytest.mark.parametrize(
    ("range_", "fragment"),
    [
        ({"uniform": [1.0, 1.0]}, "must not be empty (low < high), but is [1.0, 1.0]"),
        ({"int": [8, 4]}, "must not be empty (low < high), but is [8, 4]"),
        ({"log_uniform": [0, 1]}, "must lie above 0 to be log-uniform, but starts at 0"),
        ({"int": [1.5, 4]}, "must be two integers"),
        ({"uniform": [1]}, "must be two numbers `[low, high]`"),
        ({"choice": []}, "must list its choices"),
        ({"choice": ["a", "a"]}, "must list each choice once"),
        ({"normal": [0, 1]}, "must be a mapping with one of log_uniform, uniform, int, choice"),
        ({"uniform": [0, 1], "step": 2}, "must have no option beside `uniform`, but has `step`"),
        ({"int": [1, 9], "step": 0}, "must have an integer `step` >= 1, but has 0"),
    ],
)
def test_a_range_that_is_no_range_or_empty_is_one_line_naming_its_key(range_: Any, fragment: str) -> None:
    with pytest.raises(UserError, match=r"The range of `optimizer\.lr` \(src\)") as raised:
        parse_space({"optimizer.lr": range_}, "src")
    assert fragment in str(raised.value)


def test_a_space_file_holds_the_ranges_alone_or_under_sweep(tmp_path: Path) -> None:
    alone, under = tmp_path / "alone.yaml", tmp_path / "under.yaml"
    alone.write_text("optimizer.lr: {log_uniform: [1.0e-4, 0.1]}\n")
    under.write_text("sweep:\n  optimizer.lr: {log_uniform: [1.0e-4, 0.1]}\n")

    assert read_space_file(str(alone)).ranges == read_space_file(str(under)).ranges
    with pytest.raises(UserError, match="must exist, but does not"):
        read_space_file(str(tmp_path / "missing.yaml"))


def test_a_swept_key_must_not_be_overridden_too() -> None:
    space = parse_space({"optimizer.lr": {"log_uniform": [1.0e-4, 0.1]}}, "src")

    with pytest.raises(UserError, match=r"must be either swept \(src\) or overridden, but is both"):
        refuse_overridden(space, ["optimizer.lr=0.1"])


def test_a_trials_values_become_one_nested_layer_a_component_name_first() -> None:
    assert nested({"optimizer": "sgd", "optimizer.lr": 0.1, "model.embeddings.dim": 8}) == {
        "optimizer": {"name": "sgd", "lr": 0.1},
        "model": {"embeddings": {"dim": 8}},
    }


@pytest.mark.parametrize(
    ("space", "args", "fragments"),
    [
        ("optimizer.lrr: {log_uniform: [1.0e-4, 0.1]}", [], ["optimizer.lrr", "Did you mean"]),
        ("optimizer.lr: {uniform: [0.1, 0.01]}", [], ["must not be empty (low < high), but is [0.1, 0.01]"]),
        ("optimizer.name: {choice: [adamw, nosuch]}", [], ["nosuch"]),
        ("model.embeddings.dim: {uniform: [4, 8]}", [], ["model.embeddings.dim"]),
        ("optimizer.lr: {log_uniform: [1.0e-4, 0.1]}", ["--trials", "0"], ["`--trials` must be >= 1, but is 0"]),
        (
            "optimizer.lr: {log_uniform: [1.0e-4, 0.1]}",
            ["--parallel", "0"],
            ["`--parallel` must be >= 1, but is 0"],
        ),
    ],
)
def test_misuse_is_one_line_and_exit_code_2_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], space: str, args: list[str], fragments: list[str]
) -> None:
    (tmp_path / "space.yaml").write_text(space + "\n")
    argv = ["sweep", "ctr_tiny", "-o", str(tmp_path / "out"), "--space", str(tmp_path / "space.yaml")]
    argv += args if "--trials" in args else ["--trials", "2", *args]

    code, _, err = run_main(capsys, *argv)

    assert code == 2
    assert_one_line_error(err, *fragments)
    assert not (tmp_path / "out").exists()


def test_a_preset_without_a_space_is_refused_without_space_file(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(capsys, "sweep", "ctr_tiny", "--trials", "2")

    assert code == 2
    assert_one_line_error(err, "must declare a `sweep:` space")


def test_a_preset_inherits_its_bases_space_which_is_checked_in_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "recipes.yaml").write_text(
        "base:\n  based_on: ctr_tiny\n  sweep:\n    optimizer.lr: {log_uniform: [0.1, 0.01]}\n"
        "child:\n  based_on: base\n"
    )
    monkeypatch.chdir(tmp_path)

    code, _, err = run_main(capsys, "sweep", "child", "--trials", "1")

    assert code == 2
    assert_one_line_error(err, "The range of `optimizer.lr` (preset 'base'", "but is [0.1, 0.01] instead")
