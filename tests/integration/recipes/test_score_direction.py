"""The score's direction comes from its metric (GitHub issue 45): a loss ranks lower-first in every place that ranks
checkpoints, the run's ``config.yaml`` says so for readers, and a contradicting ``trainer.lower_better`` stops the
run at start-up in one line."""

from __future__ import annotations

from pathlib import Path

import yaml

from support.cli_runs import assert_one_line_error, checkpoints_listing
from support.resume_helpers import check_ok, committed_steps, metric_history, run_recipes, train_args


def test_a_loss_as_score_keeps_and_loads_its_lowest_checkpoint_without_lower_better(tmp_path: Path) -> None:
    output_dir = tmp_path / "run"
    overrides = ("trainer.validate_every_n_steps=10", "trainer.score_metric=log_loss", "checkpoint.keep_best_n=1")
    args = train_args(output_dir, "checkpoint.keep_last_n=null", *overrides)
    check_ok(run_recipes(tmp_path, *args))

    losses = {line["step"]: line["log_loss"] for line in metric_history(output_dir)["valid"]}
    best = min(sorted(losses), key=lambda step: losses[step])  # The earlier step wins a tie.
    assert len(set(losses.values())) > 1
    assert committed_steps(output_dir) == sorted({best, 40})  # The best by log loss, and the newest.
    config = yaml.safe_load((output_dir / "config.yaml").read_text())["config"]
    assert config["trainer"]["lower_better"] is True  # What readers of the run rank by.
    best_rows = [row for row in checkpoints_listing(output_dir).splitlines() if row.endswith("<- best")]
    assert [int(row.split()[0]) for row in best_rows] == [best]  # As `--checkpoint auto` and `best` choose.
    # The same command again resumes, though its config leaves lower_better unset and the checkpoint's says true.
    assert "Resumed from the checkpoint of step 40" in check_ok(run_recipes(tmp_path, *args)).stderr + (
        (output_dir / "logs" / "rank_0.log").read_text()
    )


def test_a_lower_better_that_contradicts_the_metric_stops_the_run_before_its_first_step(tmp_path: Path) -> None:
    output_dir = tmp_path / "run"
    args = train_args(output_dir, "trainer.score_metric=auc", "trainer.lower_better=true")

    result = run_recipes(tmp_path, *args)

    assert result.returncode == 2, result.stderr
    assert_one_line_error(result.stderr, "`trainer.lower_better` must be false for `trainer.score_metric: valid/auc`")
    assert not (output_dir / "checkpoints").exists() or not any((output_dir / "checkpoints").iterdir())


# ctr_tiny scored by its log loss, lower_better unset (the metric says it), two scored checkpoints kept.
BY_LOSS = """
ctr_by_loss:
  based_on: ctr_tiny
  config:
    trainer: {max_num_steps: 40, validate_every_n_steps: 20, score_metric: valid/log_loss}
    checkpoint: {every_n_steps: 20, keep_last_n: null, keep_best_n: null}
    dataset: {num_train_samples: 1024, num_valid_samples: 256, batch_size: 32, vocab_size: 200}
    metrics: {recorders: {console: false}}
"""


def test_eval_of_a_preset_scored_by_a_loss_loads_the_checkpoint_of_the_lowest_loss(tmp_path: Path) -> None:
    """The preset's `trainer.lower_better` is unset; read as false, `eval PRESET OUTPUT_DIR --checkpoint best` loaded
    the checkpoint of the highest loss, silently. The run's config.yaml holds the direction it ranked by."""
    (tmp_path / "recipes.yaml").write_text(BY_LOSS)
    check_ok(run_recipes(tmp_path, "train", "ctr_by_loss", "-o", "run"))
    losses = {line["step"]: line["log_loss"] for line in metric_history(tmp_path / "run")["valid"]}
    assert sorted(losses) == committed_steps(tmp_path / "run") == [20, 40]
    assert losses[20] != losses[40]

    check_ok(run_recipes(tmp_path, "eval", "ctr_by_loss", "run", "--checkpoint", "best"))

    [evaluated] = metric_history(tmp_path / "run")["eval_valid"]
    assert evaluated["step"] == min(losses, key=lambda step: losses[step])
    assert evaluated["log_loss"] == losses[evaluated["step"]]
