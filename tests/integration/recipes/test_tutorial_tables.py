"""The second tutorial (docs/tutorials/sparse-tables.md), run as the page has it: a recommender of one's own with
sparse tables and no wiring trains, resumes, reshards from 2 processes to 1, and resumes bit-exact after kill -9.

The commands are read from the page; the folder they run in is ``examples/my_recommender`` copied out of the
checkout (its files are the page's: ``tests/unit/recipes/test_examples.py`` checks it)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from support import warm_runs
from support.doc_tutorials import (
    TABLES_FOLDER,
    TABLES_TUTORIAL,
    Tutorial,
    command_args,
    copy_example,
    read_tutorial,
)
from support.resume_helpers import (
    assert_same_training,
    check_ok,
    committed_steps,
    kill_hard,
    load_verified,
    recipes_env,
    start_recipes,
    tensorboard_scalars,
    wait_for_checkpoint,
)


@pytest.fixture(scope="module")
def tutorial() -> Tutorial:
    return read_tutorial(TABLES_TUTORIAL)


@pytest.fixture(scope="module")
def ran(
    tutorial: Tutorial, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, list[subprocess.CompletedProcess[str]]]:
    """The tutorial's folder after every command it shows has run, in order (the TensorBoard server aside)."""
    root = tmp_path_factory.mktemp("tutorial_tables")
    copy_example(TABLES_FOLDER, root)
    cwd, results = root, []
    for command in tutorial.commands:
        args = command_args(command)
        if args[0] == "cd":
            cwd = cwd / args[1]
            continue
        if Path(args[0]).name == "tensorboard":
            assert Path(args[0]).is_file() and args[1:] == ["--logdir", "out/tb"]
            continue
        result = warm_runs.run(args, cwd, recipes_env(), timeout=300)
        results.append(check_ok(result))
    return cwd, results


def test_the_tables_are_reported_trained_and_resumed(ran: tuple[Path, list[subprocess.CompletedProcess[str]]]) -> None:
    project, results = ran

    first = results[0].stdout
    for table in ("user", "movie"):
        assert re.search(rf"^sparse table '{table}' \(model\.tables\): [\d,]+ rows x 32, ", first, re.MULTILINE)
    assert committed_steps(project / "out") == [300, 400]
    valid = tensorboard_scalars(project / "out", "valid", "auc")
    assert [step for step, _ in valid] == [100, 200, 300, 400]
    assert valid[-1][1] > 0.7  # ids alone; a model that learned nothing scores 0.5
    rows = load_verified(project / "out" / "checkpoints" / "step_400", "rank_0.pt")["sharded"]["tables"]["tables"]
    assert set(rows) == {"user", "movie"}


def test_a_two_process_run_resumes_on_one(ran: tuple[Path, list[subprocess.CompletedProcess[str]]]) -> None:
    project, _ = ran

    assert committed_steps(project / "out2") == [300, 400]
    two_ranks = load_verified(project / "out2" / "checkpoints" / "step_300", "rank_1.pt")
    assert two_ranks["sharded"]["tables"]["tables"]
    valid = tensorboard_scalars(project / "out2", "valid", "auc")
    assert [step for step, _ in valid] == [100, 200, 300, 400]
    assert valid[-1][1] > 0.7  # ids alone; a model that learned nothing scores 0.5


def test_kill_9_mid_run_then_the_same_command_resumes_bit_exact(tutorial: Tutorial, tmp_path: Path) -> None:
    project = copy_example(TABLES_FOLDER, tmp_path)
    first_train = next(command_args(c) for c in tutorial.commands if "train" in c)
    args = first_train[3:]  # after `python -m recipes`
    assert args[:2] == ["train", "mf_movielens"] and args[2:] == ["-o", "out"]

    check_ok(warm_runs.run([*first_train[:3], "train", "mf_movielens", "-o", "reference"], project, recipes_env(), 300))
    process = start_recipes(project, "train", "mf_movielens", "-o", "out")
    wait_for_checkpoint(project / "out", 100, process)
    kill_hard(process)
    check_ok(warm_runs.run(first_train, project, recipes_env(), timeout=300))

    assert_same_training(project / "reference", project / "out", final_step=300)
