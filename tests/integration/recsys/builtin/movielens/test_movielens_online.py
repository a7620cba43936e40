"""The ``movielens_online`` preset: MovieLens in daily windows in time order, the history first, each day scored
by the model before it trains on it, and that AUC in TensorBoard's run ``window``."""

from __future__ import annotations

from pathlib import Path

from support.resume_helpers import check_ok, metric_history, run_recipes, tensorboard_scalars

SHORT = ["trainer.max_num_windows=6", "dataset.batch_size=1024"]


def test_movielens_online_scores_each_day_before_training_on_it(tmp_path: Path) -> None:
    # Steps of 1024 ratings rather than the preset's 64: the history trains in 79 steps instead of 1,250.
    check_ok(run_recipes(tmp_path, "train", "movielens_online", "-o", "out", *SHORT, timeout=600))

    rows = metric_history(tmp_path / "out")["window"]
    assert [row["window"] for row in rows] == [
        "before-2012-06-09",
        "2012-06-09",
        "2012-06-10",
        "2012-06-11",
        "2012-06-15",
        "2012-06-16",
    ]
    assert [row["window_index"] for row in rows] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    steps = [row["step"] for row in rows]
    assert steps[0] == 1
    assert steps == sorted(set(steps))  # Every window trains at least one step.
    # 79,990 history ratings in steps of 1024: the first day starts training after them.
    assert steps[1] == 1 + -(-79_990 // 1024)
    assert [step for step, _ in tensorboard_scalars(tmp_path / "out", "window", "auc")] == steps
    assert 0.45 < rows[0]["auc"] < 0.6  # An untrained model on the history.
