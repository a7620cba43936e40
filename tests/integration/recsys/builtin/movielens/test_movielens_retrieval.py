"""The retrieval presets as a user runs them: ``movielens_two_tower`` validated by ranking every movie, the same
figures on 1 and 2 ranks; ``movielens_1m_sasrec`` on MovieLens-1M's own ``ratings.dat``; both exported for
serving; misuse in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pa_parquet
import pytest
import torch

from support.cli_runs import assert_one_line_error, run_main
from support.movielens_1m import write_movielens_1m
from support.resume_helpers import check_ok, metric_history, run_recipes

SHORT = ["trainer.max_num_steps=6", "trainer.validate_every_n_steps=6", "metrics.recorders.console=false"]


def eval_values(stdout: str) -> dict[str, float]:
    line = next(line for line in stdout.splitlines() if line.startswith("valid: "))
    return {key: float(value) for key, value in (pair.split("=") for pair in line.split()[1:])}


def test_two_tower_ranks_every_movie_and_two_ranks_give_the_figures_of_one(tmp_path: Path) -> None:
    check_ok(run_recipes(tmp_path, "train", "movielens_two_tower", "-o", "out", *SHORT, timeout=600))
    last = metric_history(tmp_path / "out")["valid"][-1]

    one = eval_values(check_ok(run_recipes(tmp_path, "eval", "out")).stdout)
    two = eval_values(check_ok(run_recipes(tmp_path, "eval", "out", "--nproc", "2", timeout=600)).stdout)

    assert {"hr@10", "ndcg@10", "hr@50", "ndcg@50"} <= set(last)
    assert 0 < last["hr@50"] < 1 and last["ndcg@10"] <= last["hr@10"] <= last["hr@50"]
    for key in ("hr@10", "ndcg@10", "hr@50", "ndcg@50"):
        assert one[key] == pytest.approx(last[key], abs=1e-6)
        assert two[key] == pytest.approx(one[key], abs=1e-6)


def test_two_tower_exports_its_query_tower_and_every_item_vector(tmp_path: Path) -> None:
    check_ok(run_recipes(tmp_path, "train", "movielens_two_tower", "-o", "out", *SHORT, timeout=600))

    check_ok(run_recipes(tmp_path, "export", "out", "-o", "served"))

    model = json.loads((tmp_path / "served/model.json").read_text())
    items = pa_parquet.read_table(tmp_path / "served/items.parquet")
    movies = pa_parquet.read_table(tmp_path / "served/tables/movieId.parquet")
    assert model["items"] == {
        "file": "items.parquet",
        "table": "movieId",
        "feature": "movieId",
        "dim": 64,
        "rows": movies.num_rows,
        "temperature": 0.05,
        "values": "tables/movieId.values.parquet",
    }
    assert items.column("id").to_pylist() == movies.column("id").to_pylist()
    values = pa_parquet.read_table(tmp_path / "served/tables/movieId.values.parquet")
    named = set(values.column("id").to_pylist())
    assert set(items.column("id").to_pylist()) - {0} <= named  # every item but the empty value's row has its text
    assert set(values.column("feature").to_pylist()) == {"movieId"}
    vectors = np.array(items.column("embedding").to_pylist())
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)  # the item tower's output
    program = torch.export.load(str(tmp_path / "served" / model["program"])).module()
    queries = program(torch.zeros(3, 0), [torch.randn(3, 64)])
    assert queries.shape == (3, 64)


def test_sasrec_reads_movielens_1m_ratings_dat_given_its_folder(tmp_path: Path) -> None:
    write_movielens_1m(tmp_path / "ml-1m")

    check_ok(run_recipes(tmp_path, "train", "movielens_1m_sasrec", "-o", "out", "dataset.data_dir=ml-1m", *SHORT))

    assert metric_history(tmp_path / "out")["valid"][-1]["hr@50"] >= 0
    check_sasrec_export(tmp_path)


def check_sasrec_export(tmp_path: Path) -> None:
    """The query tower takes the history's rows unpooled, padded to 50 with each row's length; the item vectors are
    the movie table's own rows."""
    check_ok(run_recipes(tmp_path, "export", "out", "-o", "served"))

    model = json.loads((tmp_path / "served/model.json").read_text())
    assert model["inputs"] == []
    assert model["sequences"] == [{"table": "movieId", "feature": "movie_history", "dim": 64, "max_len": 50}]
    items = pa_parquet.read_table(tmp_path / "served/items.parquet")
    movies = pa_parquet.read_table(tmp_path / "served/tables/movieId.parquet")
    assert items.column("id").to_pylist() == movies.column("id").to_pylist()
    assert items.column("embedding").to_pylist() == movies.column("embedding").to_pylist()
    program = torch.export.load(str(tmp_path / "served" / model["program"])).module()
    rows = torch.randn(3, 50, 64)
    queries = program(torch.zeros(3, 0), [], [rows], [torch.tensor([0, 7, 50])])
    assert queries.shape == (3, 64)
    later = rows.clone()
    later[1, 7:] = 0.0  # a row's rows after its length are never read
    torch.testing.assert_close(program(torch.zeros(3, 0), [], [later], [torch.tensor([0, 7, 50])]), queries)


@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        (["model.item_feature=genres"], ["`model.item_feature` must name a single-valued categorical column"]),
        (["metrics.group_by=movieId"], ["is validated by ranking the corpus, so `metrics.group_by` must be null"]),
        (["model.name=mlp"], ["The model 'mlp' pools every feature, so it cannot read the sequence movie_history"]),
        (["trainer.score_metric=auc"], ["`trainer.score_metric` must name a validation metric"]),
    ],
)
def test_a_misused_retrieval_preset_stops_in_one_line_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], overrides: list[str], fragments: list[str]
) -> None:
    code, _, err = run_main(capsys, "train", "movielens_two_tower", "-o", str(tmp_path / "out"), *overrides)

    assert code == 2
    assert_one_line_error(err, *fragments)
