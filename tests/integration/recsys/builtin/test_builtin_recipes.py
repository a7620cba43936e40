"""The built-in recipes learn: sparse tables converge like dense embedding bags, DLRM learns synthetic
Criteo logs, and the MovieLens preset beats a logistic regression on the same user and movie ids."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from torch.nn.functional import binary_cross_entropy_with_logits

from recipes.cli.job import resolve_job
from recipes.cli.job_spec import JobSpec
from recipes.cli.main import main
from recsys.click.batch import CTRBatch
from recsys.tabular.formats.delimited_text import TabularReader
from recsys.tabular.schema import CategoricalColumns, TabularDataSection, resolve_path
from units import BinaryAUC

QUIET = ["metrics.recorders.console=false", "metrics.recorders.tensorboard=false", "checkpoint.every_n_steps=null"]


def final_auc(output_dir: Path) -> float:
    lines = (output_dir / "metrics" / "valid.jsonl").read_text().splitlines()
    return float(json.loads(lines[-1])["auc"])


def train(preset: str, output_dir: Path, *overrides: str) -> float:
    assert main(["train", preset, "-o", str(output_dir), *QUIET, *overrides]) == 0
    return final_auc(output_dir)


def test_ctr_with_sparse_tables_converges_like_dense_embedding_bags(tmp_path: Path) -> None:
    common = ["trainer.max_num_steps=150", "trainer.validate_every_n_steps=150"]

    sparse = train("ctr_tiny", tmp_path / "sparse", *common)
    dense = train("ctr_tiny", tmp_path / "dense", *common, "model.embeddings.backend=dense")

    assert dense > 0.8
    assert sparse >= dense - 0.01


def test_dlrm_learns_synthetic_criteo_logs(tmp_path: Path) -> None:
    auc = train(
        "dlrm_criteo_tiny", tmp_path / "dlrm", "trainer.max_num_steps=200", "trainer.validate_every_n_steps=200"
    )

    assert auc > 0.7


def user_and_movie_ids_only() -> TabularDataSection:
    """The ``movielens_small`` preset's files and time split, with the user and movie ids as the only features."""
    shipped = resolve_job(JobSpec("movielens_small")).config.dataset  # type: ignore[attr-defined]
    ids = CategoricalColumns(columns=["userId", "movieId"], num_buckets=50_000)
    return dataclasses.replace(shipped, dense=[], categorical=[ids], joins=[], derived=[])


def logistic_regression_auc(seed: int) -> float:
    """AUC on the validation split of a logistic regression on user and movie ids alone."""
    schema = user_and_movie_ids_only()
    path = resolve_path(schema.train_path)  # type: ignore[arg-type]
    torch.manual_seed(seed)
    user, movie = torch.nn.Embedding(50_000, 1), torch.nn.Embedding(50_000, 1)
    bias = torch.nn.Parameter(torch.zeros(1))
    for table in (user, movie):
        torch.nn.init.zeros_(table.weight)
    optimizer = torch.optim.Adam([user.weight, movie.weight, bias], lr=0.01)

    def logits(batch: CTRBatch) -> torch.Tensor:
        return user(batch.sparse["userId"].ids).squeeze(1) + movie(batch.sparse["movieId"].ids).squeeze(1) + bias

    reader = TabularReader(path, schema, split="train", batch_size=512, seed=seed)
    for _ in range(4):  # More epochs do not help it (measured: 0.675 after 1, 0.681 after 4).
        for batches in reader:
            for batch in batches:
                loss = binary_cross_entropy_with_logits(logits(batch), batch.labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        reader.reset()

    auc = BinaryAUC()
    with torch.no_grad():
        for batches in TabularReader(path, schema, split="valid", batch_size=512, shuffle=False, drop_last=False):
            for batch in batches:
                auc.update(torch.sigmoid(logits(batch)), batch.labels.long())
    return float(auc.compute())


def test_movielens_preset_beats_logistic_regression_on_user_and_movie_ids(tmp_path: Path) -> None:
    config = resolve_job(JobSpec("movielens_small")).config

    preset_auc = train("movielens_small", tmp_path / "movielens")
    baseline_auc = logistic_regression_auc(config.seed)

    assert baseline_auc > 0.6
    assert preset_auc > baseline_auc


def test_fp16_loss_scaling_leaves_sparse_updates_as_in_full_precision(tmp_path: Path) -> None:
    # SGD is not scale-invariant: a sparse gradient left multiplied by the loss scale (65536)
    # would blow the tables up.
    common = [
        "trainer.max_num_steps=20",
        "model.embeddings.sparse_optimizer.name=sgd",
        "trainer.validate_every_n_steps=20",
    ]

    full = train("ctr_tiny", tmp_path / "full", *common)
    half = train("ctr_tiny", tmp_path / "half", *common, "trainer.mixed_precision=fp16")

    assert abs(full - half) < 0.01


CTR_METRICS = {"auc", "log_loss", "ne", "calibration", "pr_auc", "positive_rate", "accuracy"}


@pytest.mark.parametrize("preset", ["movielens_small", "dlrm_criteo_tiny"])
def test_the_click_recipes_record_every_ctr_metric_to_tensorboard_and_jsonl(tmp_path: Path, preset: str) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    short = ["trainer.max_num_steps=20", "trainer.validate_every_n_steps=10", "metrics.recorders.console=false"]
    assert main(["train", preset, "-o", str(tmp_path), *short]) == 0

    lines = [json.loads(line) for line in (tmp_path / "metrics" / "valid.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [10, 20]
    assert set(lines[-1]) >= CTR_METRICS
    accumulator = EventAccumulator(str(tmp_path / "tb" / "valid"))
    accumulator.Reload()
    assert set(accumulator.Tags()["scalars"]) >= CTR_METRICS
    assert 0 < lines[-1]["ne"] < 1.2 and 0.5 < lines[-1]["calibration"] < 2
