"""``eval`` and ``predict``: one signature, every row scored, predictions in input order that reproduce the metrics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.csv as pa_csv
import pyarrow.parquet as pa_parquet
import pytest
import torch

from support.cli_runs import assert_one_line_error, printed_by_main, run_main
from support.resume_helpers import check_ok, metric_history, run_recipes
from units import BinaryAUC

MOVIELENS_VALID_ROWS = 20_001
TINY = ["trainer.max_num_steps=20", "trainer.validate_every_n_steps=20", "metrics.recorders.console=false"]
# movielens_small for 20 steps rather than its two epochs, shuffled in windows of 10,240 rather than its whole training
# set: these tests check which rows are scored, in what order and with what metrics, not how well the model learned.
MOVIELENS_SHORT = ["trainer.max_num_data_epochs=null", "dataset.shuffle_buffer_size=10240", *TINY]


def read_table(path: Path) -> dict[str, np.ndarray]:
    table = pa_parquet.read_table(path) if path.suffix == ".parquet" else pa_csv.read_csv(path)
    return {name: table.column(name).to_numpy() for name in table.column_names}


def auc_of(columns: dict[str, np.ndarray]) -> float:
    metric = BinaryAUC()
    metric.update(torch.tensor(columns["score"], dtype=torch.float32), torch.tensor(columns["label"]).long())
    return float(metric.compute())


def eval_values(stdout: str, name: str = "valid") -> dict[str, float]:
    line = next(line for line in stdout.splitlines() if line.startswith(f"{name}: "))
    return {key: float(value) for key, value in (pair.split("=") for pair in line.split()[1:])}


@pytest.fixture(scope="module")
def ctr_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ctr_predict")
    check_ok(run_recipes(root, "train", "ctr_tiny", "-o", "out", *TINY))
    return root


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_predict_writes_every_validation_row_and_its_metrics_are_the_validations(
    ctr_run: Path, suffix: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ctr_run)
    printed = printed_by_main(capsys, "predict", "out", "-o", f"predictions{suffix}")

    columns = read_table(ctr_run / f"predictions{suffix}")
    assert set(columns) == {"label", "score"}
    assert len(columns["label"]) == 8192
    assert ((columns["score"] > 0) & (columns["score"] < 1)).all()
    last_validation = metric_history(ctr_run / "out")["valid"][-1]
    assert auc_of(columns) == pytest.approx(last_validation["auc"], abs=1e-6)
    assert eval_values(printed)["auc"] == pytest.approx(last_validation["auc"], abs=1e-5)


def test_eval_takes_an_output_directory_alone_or_a_preset_and_it(
    ctr_run: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ctr_run)
    alone = printed_by_main(capsys, "eval", "out", "--checkpoint", "best")
    with_preset = printed_by_main(capsys, "eval", "ctr_tiny", "out", *TINY)

    assert eval_values(alone) == eval_values(with_preset)
    assert set(eval_values(alone)) >= {"auc", "log_loss", "ne", "calibration", "pr_auc", "positive_rate"}


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--split", "test", "-o", "p.csv"], "`--split` must be a split the recipe has data for (valid)"),
        (["-o", "p.txt"], "`-o` must end in .csv or .parquet"),
        (["-o", "/proc/p.csv"], "cannot be written"),
        (["-o", "out"], "`-o` must end in"),
    ],
)
def test_a_bad_predict_request_is_one_line_and_exit_2(
    ctr_run: Path, args: list[str], fragment: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ctr_run)

    code, _, err = run_main(capsys, "predict", "out", *args)

    assert code == 2
    assert_one_line_error(err, fragment)


def test_predict_into_a_folder_that_does_not_exist_is_refused_and_makes_none(
    ctr_run: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ctr_run)

    code, _, err = run_main(capsys, "predict", "out", "-o", "misspelt/predictions.csv")

    assert code == 2
    assert_one_line_error(err, "`-o` must be a file in a folder that exists, but misspelt does not exist.")
    assert not (ctr_run / "misspelt").exists()


@pytest.mark.parametrize("command", ["predict", "importance"])
def test_an_output_among_the_runs_checkpoints_which_training_prunes_is_refused(
    ctr_run: Path, command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ctr_run)
    [step_dir] = (ctr_run / "out" / "checkpoints").glob("step_*")
    target = f"out/checkpoints/{step_dir.name}/predictions.csv"

    code, _, err = run_main(capsys, command, "out", "-o", target)

    assert code == 2
    assert_one_line_error(err, "`-o` must be a file outside the run's checkpoints, which training deletes when")
    assert not (step_dir / "predictions.csv").exists()


def test_eval_with_an_output_directory_that_is_a_file_is_one_line_and_exit_2(
    ctr_run: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ctr_run)
    (ctr_run / "a_file").write_text("mine")

    code, _, err = run_main(capsys, "eval", "ctr_tiny", "-o", "a_file", *TINY)

    assert code == 2
    assert_one_line_error(err, "The output directory a_file must be a directory or not exist yet, but is a file.")
    assert (ctr_run / "a_file").read_text() == "mine"


@pytest.mark.parametrize("train_nproc", [1, 2])
def test_movielens_predictions_hold_every_validation_row_on_1_and_2_ranks(
    tmp_path: Path, train_nproc: int, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    train = ["train", "movielens_small", "-o", "out", *MOVIELENS_SHORT, "--nproc", str(train_nproc)]
    check_ok(run_recipes(tmp_path, *train, timeout=600))
    last_validation = metric_history(tmp_path / "out")["valid"][-1]

    monkeypatch.chdir(tmp_path)
    one = printed_by_main(capsys, "predict", "out", "--split", "valid", "-o", "one.csv")
    check_ok(run_recipes(tmp_path, "predict", "out", "--split", "valid", "-o", "two.csv", "--nproc", "2"))
    evaluated = check_ok(run_recipes(tmp_path, "eval", "out", "--nproc", "2"))

    one_rank, two_ranks = read_table(tmp_path / "one.csv"), read_table(tmp_path / "two.csv")
    assert len(one_rank["label"]) == len(two_ranks["label"]) == MOVIELENS_VALID_ROWS
    assert (one_rank["label"] == two_ranks["label"]).all()  # the same rows, in the same (input) order
    np.testing.assert_allclose(one_rank["score"], two_ranks["score"], atol=1e-5)
    for columns in (one_rank, two_ranks):
        assert auc_of(columns) == pytest.approx(last_validation["auc"], abs=1e-4)
    assert eval_values(one)["auc"] == pytest.approx(last_validation["auc"], abs=1e-4)
    assert eval_values(evaluated.stdout)["auc"] == pytest.approx(last_validation["auc"], abs=1e-4)
    assert {"auc", "log_loss", "ne", "calibration", "pr_auc"} <= set(last_validation)


def test_eval_with_a_config_that_builds_another_model_is_one_line_and_exit_2(
    ctr_run: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ctr_run)

    code, _, err = run_main(capsys, "eval", "ctr_tiny", "out", *TINY, "model.embeddings.dim=8")

    assert code == 2
    assert_one_line_error(err, "The checkpoint's model must be the one the config builds", "size mismatch")
