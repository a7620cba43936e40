"""Several labels through ``python -m recipes``: a two-task run on MovieLens ratings (``rating >= 4`` as a binary task,
the rating itself as a regression task) keeps its best checkpoint by one task's AUC, ``predict`` writes a label and a
score column per task, and ``export``'s program returns both scores; a model of one output, or a score metric of no
task, stops the run in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.csv as pa_csv
import pytest
import torch
import yaml

from recsys.tabular.schema import resolve_path
from support.cli_runs import assert_one_line_error, run_main
from support.resume_helpers import check_ok, metric_history, run_recipes
from units import BinaryAUC, MeanSquaredError

PRESET = """
recipe: tabular
config:
  dataset:
    train_path: train.csv
    valid_path: valid.csv
    labels:
      - {name: liked, column: rating, threshold: 4.0}
      - {column: rating, kind: regression, weight: 0.2}
    categorical:
      - {columns: [userId, movieId], num_buckets: 5000}
    batch_size: 64
  model: {name: dcn_v2, hidden_dims: [16], cross_layers: 1, embeddings: {dim: 8}}
  trainer: {max_num_steps: 20, validate_every_n_steps: 5, score_metric: valid/liked/auc}
  checkpoint: {every_n_steps: 5, keep_best_n: 1}
  metrics: {recorders: {console: false}}
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short two-task run on the first 3,000 of the shipped ratings, validated on the next 1,000."""
    root = tmp_path_factory.mktemp("several_labels")
    lines = Path(resolve_path("package://recsys.builtin.movielens/ml-latest-small/ratings.csv")).read_text().split("\n")
    (root / "train.csv").write_text("\n".join(lines[:3001]) + "\n")
    (root / "valid.csv").write_text("\n".join([lines[0], *lines[3001:4001]]) + "\n")
    (root / "multitask.yaml").write_text(PRESET)
    check_ok(run_recipes(root, "train", "multitask.yaml", "-o", "out"))
    return root


def test_each_task_is_validated_under_its_name_and_the_best_checkpoint_is_the_best_auc_of_its_task(run: Path) -> None:
    history = metric_history(run / "out")["valid"]

    assert [line["step"] for line in history] == [5, 10, 15, 20]
    assert {"liked/auc", "liked/log_loss", "liked/ne", "rating/mse", "rating/mae"} <= set(history[0])
    assert not {"auc", "mse", "liked/mse", "rating/auc"} & set(history[0])
    best = max(history, key=lambda line: line["liked/auc"])["step"]
    kept = {path.name for path in (run / "out" / "checkpoints").iterdir()}
    assert kept == {f"step_{best}", "step_20"}  # The best by the task's AUC (higher), and the newest.
    assert yaml.safe_load((run / "out" / "config.yaml").read_text())["config"]["trainer"]["lower_better"] is False


def test_predict_writes_a_label_and_a_score_column_per_task_that_give_the_validations_metrics(
    run: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(run)
    code, _, err = run_main(capsys, "predict", "out", "--checkpoint", "last", "-o", "predictions.csv")
    assert code == 0, err

    table = pa_csv.read_csv(run / "predictions.csv")
    assert table.column_names == ["liked_label", "liked_score", "rating_label", "rating_score"]
    columns = {name: torch.tensor(table.column(name).to_numpy(), dtype=torch.float32) for name in table.column_names}
    assert len(columns["liked_label"]) == 1000
    assert torch.equal(columns["liked_label"], (columns["rating_label"] >= 4).float())
    auc, mse = BinaryAUC(), MeanSquaredError()
    auc.update(columns["liked_score"], columns["liked_label"].long())
    mse.update(columns["rating_score"], columns["rating_label"])
    last = metric_history(run / "out")["valid"][-1]
    assert float(auc.compute()) == pytest.approx(last["liked/auc"], abs=1e-5)
    assert float(mse.compute()) == pytest.approx(last["rating/mse"], rel=1e-5)


def test_export_names_the_tasks_and_its_program_returns_each_tasks_score(
    run: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(run)
    code, _, err = run_main(capsys, "export", "out", "-o", "exported")
    assert code == 0, err

    model = json.loads((run / "exported" / "model.json").read_text())
    assert model["outputs"] == ["liked", "rating"] and model["program"] == "dense.pt2"
    program = torch.export.load(str(run / "exported" / "dense.pt2")).module()
    generator = torch.Generator().manual_seed(0)
    pooled = [torch.randn(5, spec["dim"], generator=generator) for spec in model["inputs"]]
    scores = program(torch.zeros(5, model["num_dense"]), pooled)
    assert scores.shape == (5, 2)
    assert bool(((scores[:, 0] > 0) & (scores[:, 0] < 1)).all())


@pytest.mark.parametrize(
    ("override", "fragments"),
    [
        (
            "model.name=fm",
            [
                "`dataset.labels` names 2 tasks",
                "an output per task (bst, dcn_v2, deepfm",
                "'fm'",
            ],
        ),
        ("trainer.score_metric=valid/clicked/auc", ["'valid/clicked/auc'", "Did you mean 'valid/liked/auc'?"]),
        ("dataset.labels=[{column: rating}, {column: rating}]", ["['rating'] are named twice"]),
        (
            ("model={name: mmoe}", "dataset.labels=[{column: rating, kind: regression}]"),
            ["The model 'mmoe' learns several tasks at once", "at least 2 tasks", "but have 1 instead"],
        ),
        (
            "model={name: esmm}",
            ["The model 'esmm' fits pCTR and pCTCVR", "but is 'liked' (binary), 'rating' (regression)"],
        ),
    ],
)
def test_a_wrong_multi_task_config_stops_the_run_in_one_line_with_exit_2(
    run: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    override: str | tuple[str, ...],
    fragments: list[str],
) -> None:
    monkeypatch.chdir(run)
    code, _, err = run_main(
        capsys, "train", "multitask.yaml", "-o", "refused", *([override] if isinstance(override, str) else override)
    )

    assert code == 2
    assert_one_line_error(err, *fragments)
    assert not (run / "refused" / "checkpoints").exists()


def test_a_regression_tasks_mse_ranks_checkpoints_lower_first(run: Path) -> None:
    scored = ["trainer.score_metric=valid/rating/mse", "trainer.max_num_steps=5", "checkpoint.every_n_steps=5"]
    check_ok(run_recipes(run, "train", "multitask.yaml", "-o", "by_mse", *scored))

    assert yaml.safe_load((run / "by_mse" / "config.yaml").read_text())["config"]["trainer"]["lower_better"] is True
    assert np.isfinite(metric_history(run / "by_mse")["valid"][-1]["rating/mse"])


@pytest.mark.parametrize(
    ("model", "labels"),
    [
        ("{name: mmoe, num_experts: 2, expert_dims: [8], tower_dims: []}", None),
        ("{name: ple, expert_dims: [8], tower_dims: [4]}", None),
        # A click (rating >= 3) and, within it, a conversion (rating >= 4.5): ESMM's click AND conversion.
        (
            "{name: esmm, tower_dims: [8]}",
            "[{name: click, column: rating, threshold: 3.0}, {name: ctcvr, column: rating, threshold: 4.5}]",
        ),
    ],
)
def test_the_multi_task_models_train_from_a_config_and_validate_each_task(
    run: Path, model: str, labels: str | None
) -> None:
    name = model.split(",")[0].removeprefix("{name: ")
    overrides = [f"model={model}", "trainer.max_num_steps=5", "checkpoint.every_n_steps=5"]
    if labels is not None:
        overrides += [f"dataset.labels={labels}", "trainer.score_metric=valid/click/auc"]
    check_ok(run_recipes(run, "train", "multitask.yaml", "-o", name, *overrides))

    last = metric_history(run / name)["valid"][-1]
    keys = ["click/auc", "ctcvr/auc"] if labels is not None else ["liked/auc", "rating/mse"]
    assert all(np.isfinite(last[key]) for key in keys), last
