"""The first step's checks of a recipe's train reader on real 2-process gloo jobs: ranks that read the same rows, or
batches other than their share of the configured size, stop every rank with the same line before any update."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from embedding import JaggedIds, SparseFeatures
from recipes.errors import UserError
from recipes.training.step_checks import ConfiguredBatchSize, StepChecks
from recsys.click.batch import CTRBatch
from support.gloo_jobs import free_port, gloo_gang, start_ranks
from support.linear_regression import FEATURES, TARGETS, SquaredErrorUnit, linear_model
from support.paths import EXAMPLES
from support.resume_helpers import error_line, run_recipes
from units import MetricBag, TrainUnit

BATCH_SIZE = ConfiguredBatchSize("data.batch_size", 16)

# Each case: which rows of the regression data rank 0 and rank 1 read, with a global batch of 16.
ROW_CASES = {
    "split": (range(0, 8), range(8, 16)),
    "same rows": (range(0, 8), range(0, 8)),
    "whole batch on each rank": (range(0, 16), range(16, 32)),
    "neither": (range(0, 16), range(0, 16)),
}


class ClickUnit(TrainUnit[CTRBatch]):
    """A loss of one element per click label, whatever the features: only the rows and the batch matter here."""

    def __call__(self, batch: CTRBatch) -> torch.Tensor:
        return batch.labels * self.model.weight.sum()


def click_batch(ids: list[int]) -> CTRBatch:
    """Two rows whose dense features and labels are the same on every rank; their sparse ids are ``ids``."""
    sparse = SparseFeatures({"item": JaggedIds.from_dense(torch.tensor(ids).reshape(2, 1))})
    return CTRBatch(dense=torch.ones(2, 3), sparse=sparse, labels=torch.ones(2))


def first_step_errors(rank: int, world_size: int, port: int, out_dir: str) -> None:
    """Each case's first step on this rank: the error it stopped with, or ``None``."""
    errors: dict[str, str | None] = {}
    with gloo_gang(rank, world_size, port) as gang:
        for case, rows_of_rank in ROW_CASES.items():
            rows = list(rows_of_rank[rank])
            checks = StepChecks(SquaredErrorUnit(linear_model()), gang, BATCH_SIZE)
            errors[case] = _first_step_error(checks, (FEATURES[rows], TARGETS[rows]))
        for case, ids in {"other sparse ids": [rank, 2], "same sparse ids": [0, 2]}.items():
            click_checks = StepChecks(ClickUnit(linear_model(), MetricBag(gang)), gang, None)
            errors[case] = _first_step_error(click_checks, click_batch(ids))
        Path(out_dir, f"rank_{rank}.json").write_text(json.dumps(errors))


def _first_step_error(checks: StepChecks[Any], batch: object) -> str | None:
    """The error of a first step of one micro-batch, or ``None``."""
    try:
        checks.summed_loss(batch, is_last=True)
    except UserError as error:
        return str(error)
    return None


def test_ranks_that_read_the_same_rows_or_other_than_their_share_stop_together_with_the_same_line(
    tmp_path: Path,
) -> None:
    start_ranks(first_step_errors, (2, free_port(), str(tmp_path)), world_size=2)

    errors = [json.loads((tmp_path / f"rank_{rank}.json").read_text()) for rank in range(2)]
    assert errors[0] == errors[1], "every rank must stop with the same line"
    same_rows = (
        "At the first step, data-parallel ranks 0 and 1 read the same batches: the train reader must split the "
        "rows by `context.gangs.dp.rank` and `context.gangs.dp.size`."
    )
    wrong_sizes = (
        "At the first step, the train loss has the wrong number of rows a micro-batch (rank 0: 16, rank 1: 16): "
        "`data.batch_size`=16 over 2 data-parallel rank(s) makes 8; the train reader must read "
        "`per_rank_batch_size(config.data.batch_size, context.gangs.dp.size)` rows, and the train unit return one "
        "loss row per batch row."
    )
    assert errors[0] == {
        "split": None,
        "same rows": same_rows,
        "whole batch on each rank": wrong_sizes,
        "neither": f"{same_rows} {wrong_sizes}",
        "other sparse ids": None,
        "same sparse ids": same_rows,
    }


def test_the_tutorial_recipe_with_a_reader_that_ignores_the_ranks_stops_at_the_first_step_on_2_processes(
    tmp_path: Path,
) -> None:
    """The slip of the issue: the tutorial's reader without its DP split and per-rank batch size trained on with
    another result. Now every rank stops at the first step, before any checkpoint, with exit code 2."""
    shutil.copy(EXAMPLES / "my_project" / "recipes.yaml", tmp_path)
    source = (EXAMPLES / "my_project" / "linreg.py").read_text()
    per_rank = "batch_size=per_rank_batch_size(context.config.data.batch_size, context.gangs.dp.size),"
    split = "dp_rank=context.gangs.dp.rank,\n            dp_size=context.gangs.dp.size,\n"
    assert per_rank in source and split in source
    slipped = source.replace(per_rank, "batch_size=context.config.data.batch_size,").replace(split, "")
    (tmp_path / "linreg.py").write_text(slipped)

    result = run_recipes(tmp_path, "train", "linreg_demo", "-o", "out", "--nproc", "2")

    assert result.returncode == 2, result.stderr
    line = error_line(result)
    assert "data-parallel ranks 0 and 1 read the same batches" in line
    assert "(rank 0: 64, rank 1: 64): `data.batch_size`=64 over 2 data-parallel rank(s) makes 32" in line
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out" / "checkpoints").exists() or not any((tmp_path / "out" / "checkpoints").iterdir())
