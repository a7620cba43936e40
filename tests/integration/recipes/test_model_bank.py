"""Save filters through the CLI: ``checkpoint.exclude`` leaves parameters and tables out, and a resume
re-initialises exactly them and keeps the rest bit-exact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from checkpoint import CheckpointManager
from embedding import CombinedOptimizer
from gang import FakeGang
from recipes.cli import train as run_module
from recipes.cli.export_tables import gather_tables, ids_and_rows
from recipes.cli.job import build_parts
from recipes.cli.main import main
from recipes.training.parallel import unwrap
from recipes.training.trainer import Trainer
from support.cli_runs import run_main
from support.resume_helpers import (
    FINAL_STEP,
    TINY_RUN,
    check_ok,
    checkpoints_dir,
    load_shared_verified,
    load_weights_only,
    run_recipes,
)

EXCLUDE = "checkpoint.exclude=[mlp.0.*, embeddings.cat_0]"


def started_state(monkeypatch: pytest.MonkeyPatch, output_dir: Path, *overrides: str) -> dict[str, Any]:
    """The model and tables of a ``train`` run as training would start (resumed or fresh), taking no step."""
    captured: dict[str, Any] = {}

    def capture(trainer: Trainer[Any]) -> None:
        captured["model"] = {k: v.clone() for k, v in trainer.state.shared()["model"].items()}
        tables = trainer.state.per_rank()["sharded"]["embeddings"]["tables"]
        captured["tables"] = {name: table["weight"].clone() for name, table in tables.items()}
        optimizer = trainer.state.optimizer
        dense = optimizer.dense if isinstance(optimizer, CombinedOptimizer) else optimizer
        params = unwrap(trainer.state.model).named_parameters()
        captured["moments"] = {name: dict(dense.state[p]) for name, p in params if p in dense.state}

    with monkeypatch.context() as patch:
        patch.setattr(Trainer, "run", capture)
        assert main(["train", "ctr_tiny", "-o", str(output_dir), *TINY_RUN, *overrides]) == 0
    return captured


def test_a_resume_re_initialises_exactly_what_checkpoint_exclude_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    assert main(["train", "ctr_tiny", "-o", str(run), *TINY_RUN, EXCLUDE]) == 0
    fresh = started_state(monkeypatch, tmp_path / "fresh", EXCLUDE)
    capsys.readouterr()

    resumed = started_state(monkeypatch, run, EXCLUDE)

    step_dir = checkpoints_dir(run) / f"step_{FINAL_STEP}"
    saved_model = load_weights_only(step_dir / "model.pt")["model"]
    saved_tables = load_weights_only(step_dir / "rank_0.pt")["sharded"]["embeddings"]["tables"]
    assert sorted(set(resumed["model"]) - set(saved_model)) == ["mlp.0.bias", "mlp.0.weight"]
    assert sorted(set(resumed["tables"]) - set(saved_tables)) == ["cat_0"]
    for name, value in resumed["model"].items():
        expected = saved_model.get(name, fresh["model"][name])
        assert torch.equal(value, expected), name
    for name, value in resumed["tables"].items():
        expected = saved_tables[name]["weight"] if name in saved_tables else fresh["tables"][name]
        assert torch.equal(value, expected), name
    lines = [line for line in capsys.readouterr().out.splitlines() if "left out" in line]
    assert lines == [
        f"Resuming from step {FINAL_STEP}: its checkpoint left out 3 parameters and tables (checkpoint.exclude or "
        "the recipe's save_filter), re-initialised with fresh optimizer state: mlp.0.weight, mlp.0.bias, "
        "embeddings.cat_0."
    ]
    # The re-initialised parameters start their Adam moments afresh at the next step; the others keep theirs.
    saved_moments = load_shared_verified(step_dir)["optimizer"]["dense"]["state"]
    assert not {"mlp.0.weight", "mlp.0.bias"} & set(saved_moments)
    assert set(resumed["moments"]) == set(saved_moments)
    for name, moments in resumed["moments"].items():
        for key, value in moments.items():
            assert torch.equal(value, saved_moments[name][key]), (name, key)


def test_a_resume_trains_the_re_initialised_parameter_with_fresh_adam_moments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One step after the resume, the left-out parameter's moments are those of its first step ever."""
    run = tmp_path / "run"
    assert main(["train", "ctr_tiny", "-o", str(run), *TINY_RUN, EXCLUDE]) == 0
    resume = [*TINY_RUN, EXCLUDE, "checkpoint.exclude=[]", "trainer.max_num_steps=41"]  # saves every moment
    assert main(["train", "ctr_tiny", "-o", str(run), *resume]) == 0

    moments = load_shared_verified(checkpoints_dir(run) / "step_41")["optimizer"]["dense"]["state"]
    steps = {name: int(state["step"]) for name, state in moments.items()}
    assert steps["mlp.0.weight"] == steps["mlp.0.bias"] == 1
    assert {step for name, step in steps.items() if not name.startswith("mlp.0.")} == {41}


# Periodic reloads -----------------------------------------------------------------------------------------------

# The source has tables cat_0 and cat_1, the run cat_0..cat_2: the source's cat_1 loads as the run's cat_2, a name
# the source lacks. Every 5 steps the run reloads it; checkpoints every 10 steps, after the step's reload, so a
# checkpoint of the run holds exactly what it last loaded.
SHORT = (
    "trainer.validate_every_n_steps=10",
    "trainer.publish_metrics_every_n_steps=5",
    "checkpoint.every_n_steps=10",
    "checkpoint.keep_last_n=null",
    "checkpoint.keep_best_n=null",
    "dataset.num_train_samples=1024",
    "dataset.num_valid_samples=128",
    "dataset.batch_size=32",
    "dataset.vocab_size=200",
    "metrics.recorders.console=false",
    "gang.timeout_s=120",
)


def bank(source: Path, kind: str) -> list[str]:
    reset = ", reset_tables: [embeddings.cat_2]" if kind == "hash" else ""
    spec = f"{{path: {source}, load: [embeddings.cat_1], rename: {{embeddings.cat_1: embeddings.cat_2}}{reset}}}"
    return [f"checkpoint.model_bank=[{spec}]", "checkpoint.reload_every_n_steps=5", "dataset.num_sparse=3"]


def train(cwd: Path, output_dir: Path, steps: int, *overrides: str, nproc: int = 1) -> None:
    """``train ctr_tiny`` for ``steps`` steps (resuming where ``output_dir`` has a checkpoint), on ``nproc`` ranks:
    in this process for one, as ``--nproc`` processes over gloo otherwise."""
    args = ["train", "ctr_tiny", "-o", str(output_dir), *SHORT, f"trainer.max_num_steps={steps}", *overrides]
    if nproc == 1:
        assert main(args) == 0
    else:
        check_ok(run_recipes(cwd, *args, "--nproc", str(nproc), timeout=300))


def table_rows(output_dir: Path, step: int, table: str) -> tuple[np.ndarray, np.ndarray]:
    """The ids and rows of a table of a checkpoint, gathered from every rank that saved it."""
    manager = CheckpointManager(str(checkpoints_dir(output_dir)), FakeGang(), clean_up=False)
    tables = gather_tables(manager.load(step, keys=[]))
    return ids_and_rows(table, tables[("embeddings", table)])


def loaded_steps(log_file: Path) -> list[int]:
    """The source steps that the model bank loaded, in order, by a rank's log."""
    lines = [line for line in log_file.read_text().splitlines() if "Model bank: loaded" in line]
    return [int(line.split("/step_")[1].split(" ")[0]) for line in lines]


def check_reload(tmp_path: Path, kind: str, source_nproc: int, run_nproc: int) -> None:
    """A run loads the source's step 10 at its start and at steps 5 and 10; the source then trains to step 20 and
    the resumed run's reloads at steps 15 and 20 take that newer checkpoint, on every rank alike."""
    source, run = tmp_path / "source", tmp_path / "run"
    kinds = [f"model.embeddings.kind={kind}"]
    train(tmp_path, source, 10, *kinds, "dataset.num_sparse=2", nproc=source_nproc)
    train(tmp_path, run, 10, *kinds, *bank(source, kind), nproc=run_nproc)
    train(tmp_path, source, 20, *kinds, "dataset.num_sparse=2", nproc=source_nproc)
    train(tmp_path, run, 20, *kinds, *bank(source, kind), nproc=run_nproc)

    for step in (10, 20):
        ids, rows = table_rows(run, step, "cat_2")
        source_ids, source_rows = table_rows(source, step, "cat_1")
        assert np.array_equal(ids, source_ids), step  # a hash table reset first: the source's ids, no others
        assert np.array_equal(rows, source_rows), step
    assert not np.array_equal(table_rows(run, 10, "cat_2")[1], table_rows(run, 20, "cat_2")[1])
    logs = [run / "logs" / f"rank_{rank}.log" for rank in range(run_nproc)]
    assert [loaded_steps(log)[-5:] for log in logs] == [[10, 10, 10, 20, 20]] * run_nproc


@pytest.mark.parametrize("kind", ["fixed", "hash"])
def test_a_periodic_reload_takes_the_source_s_newer_checkpoint_renamed_and_reset(tmp_path: Path, kind: str) -> None:
    check_reload(tmp_path, kind, source_nproc=1, run_nproc=1)


@pytest.mark.parametrize(
    ("kind", "source_nproc", "run_nproc"), [("fixed", 1, 2), ("hash", 1, 2), ("fixed", 2, 1), ("hash", 2, 1)]
)
def test_a_model_bank_reloads_across_world_sizes(tmp_path: Path, kind: str, source_nproc: int, run_nproc: int) -> None:
    check_reload(tmp_path, kind, source_nproc, run_nproc)


# Refusals and scoring of checkpoints with left-out parts ----------------------------------------------------------


def leave_out_reader_and_counters(monkeypatch: pytest.MonkeyPatch) -> None:
    """Give ctr_tiny's parts a ``save_filter`` that refuses the reader's position and the trainer's counters."""

    def with_filter(*args: Any, **kwargs: Any) -> Any:
        built = build_parts(*args, **kwargs)
        built.parts.save_filter = lambda name: name not in ("data_reader", "trainer")
        return built

    monkeypatch.setattr(run_module, "build_parts", with_filter)


@pytest.mark.parametrize(
    ("how", "lost"),
    [("exclude", "the optimizer's state"), ("save_filter", "the trainer's counters, the reader's position")],
)
def test_a_resume_that_would_lose_run_state_is_one_line_and_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], how: str, lost: str
) -> None:
    run = tmp_path / "run"
    overrides = ["checkpoint.exclude=[optimizer]"] if how == "exclude" else []
    with monkeypatch.context() as patch:
        if how == "save_filter":
            leave_out_reader_and_counters(patch)
        assert main(["train", "ctr_tiny", "-o", str(run), *TINY_RUN, *overrides]) == 0
    capsys.readouterr()

    code, _, err = run_main(capsys, "train", "ctr_tiny", "-o", str(run), *TINY_RUN, "trainer.max_num_steps=50")

    assert code == 2
    assert err.strip().splitlines() == [
        f"error: The checkpoint of step {FINAL_STEP} must hold every state a resume needs, but its save filter left "
        f"out {lost}: resuming would lose it. Start in a new output directory (checkpoint.init_from to take its "
        "model), or set checkpoint.start_over=true."
    ]


@pytest.fixture(scope="module")
def excluded_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("excluded") / "run"
    assert main(["train", "ctr_tiny", "-o", str(run), *TINY_RUN, EXCLUDE]) == 0
    return run


SCORING_NOTE = (
    f"The checkpoint of step {FINAL_STEP} left out 3 parameters and tables (checkpoint.exclude or the "
    "recipe's save_filter); they score as freshly initialised: mlp.0.weight, mlp.0.bias, embeddings.cat_0."
)


@pytest.mark.parametrize("command", ["eval", "predict", "importance"])
def test_scoring_a_checkpoint_with_left_out_parts_fills_them_and_says_so(
    excluded_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    extra = ["-o", str(tmp_path / "rows.csv")] if command == "predict" else []

    code, _, err = run_main(capsys, command, str(excluded_run), "--checkpoint", "last", *extra)

    assert code == 0, err
    assert [line for line in err.splitlines() if "left out" in line] == [SCORING_NOTE]


def test_export_tables_of_a_checkpoint_with_left_out_tables_writes_the_others(
    excluded_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_main(
        capsys, "export-tables", str(excluded_run), "--checkpoint", "last", "-o", str(tmp_path / "tables")
    )

    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "tables").iterdir()) == [
        "cat_1.parquet",
        "cat_2.parquet",
        "cat_3.parquet",
    ]
