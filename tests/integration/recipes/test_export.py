"""``export``: the serving tutorial's plain-torch scorer of an export scores every validation row as ``predict`` does,
and a delta export applied over the full export of its ``--since`` step scores as the full export of the later step;
runs of 1 rank (MovieLens, fixed tables, sum and mean pooling) and 2 ranks (DLRM, fixed and hash tables)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.csv as pa_csv
import pyarrow.parquet as pa_parquet
import pytest
import torch

from support.cli_runs import assert_one_line_error, printed_by_main, run_main
from support.resume_helpers import check_ok, read_metadata, run_recipes
from support.serving_scorer import scores, split_rows, tutorial_scorer
from units import BinaryAUC

KEEP_ALL = ["checkpoint.keep_last_n=null", "checkpoint.keep_best_n=null", "metrics.recorders.console=false"]
MOVIELENS = [  # 20 steps, not a model that learned: the export must score as predict does, whatever the weights.
    "trainer.max_num_data_epochs=null",
    "trainer.max_num_steps=20",
    "trainer.validate_every_n_steps=20",
    "dataset.shuffle_buffer_size=10240",
    "checkpoint.every_n_steps=10",
    *KEEP_ALL,
]
MOVIELENS_VALID_ROWS = 20_001
# Long enough for an AUC above chance on the generated data, so that what quantising loses of it shows.
QUANTISED = [
    "trainer.max_num_steps=60",
    "checkpoint.every_n_steps=30",
    "dataset.synthetic_rows=8000",
    "dataset.batch_size=128",
    *KEEP_ALL,
]
DLRM = [
    "trainer.max_num_steps=6",
    "trainer.validate_every_n_steps=3",
    "checkpoint.every_n_steps=3",
    "dataset.synthetic_rows=4000",
    "dataset.batch_size=64",
    *KEEP_ALL,
]
# Hash tables of 16 rows for 1000 categories a feature: LRU evicts between the checkpoints, so a delta has tombstones.
SMALL_HASH_TABLES = ["dataset.num_embeddings_per_feature=[16]", "model.embeddings.hash.min_count=1"]
# Step 6's tables are deltas over step 3's: the export reads them whole, and --since 3 compares only their rows.
DELTA_CHECKPOINTS = ["checkpoint.full_every=2"]


def table_files(export: Path) -> list[Path]:
    return [path for path in (export / "tables").glob("*.parquet") if not path.name.endswith(".evicted.parquet")]


def predicted(capsys: pytest.CaptureFixture[str], run_root: Path, step: int) -> np.ndarray:
    printed_by_main(capsys, "predict", "out", "--checkpoint", str(step), "-o", f"predicted_{step}.csv")
    return pa_csv.read_csv(run_root / f"predicted_{step}.csv").column("score").to_numpy()


def export_all(capsys: pytest.CaptureFixture[str], first: int, last: int) -> None:
    """Full exports of ``first`` and ``last``, and the delta of ``last`` since ``first``, in this process."""
    printed_by_main(capsys, "export", "out", "--checkpoint", str(first), "-o", "full_first")
    printed_by_main(capsys, "export", "out", "--checkpoint", str(last), "-o", "full_last")
    printed_by_main(capsys, "export", "out", "--checkpoint", str(last), "--since", str(first), "-o", "delta")


def check_scores_and_delta(
    capsys: pytest.CaptureFixture[str], run_root: Path, first: int, last: int, num_rows: int | None = None
) -> int:
    """The scorer's scores of ``last`` against ``predict``'s, and the delta's against the full export; the number of
    ids the delta evicts."""
    scorer = tutorial_scorer()
    rows = split_rows(run_root / "out")
    full_first, full_last = scorer.load(run_root / "full_first"), scorer.load(run_root / "full_last")
    delta = scorer.load(run_root / "delta", base=full_first)

    plain = scores(scorer, full_last, rows)
    expected = predicted(capsys, run_root, last)
    if num_rows is not None:
        assert len(plain) == num_rows
    assert len(plain) == len(expected)
    np.testing.assert_allclose(plain, expected, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(scores(scorer, delta, rows), plain)
    assert not np.array_equal(scores(scorer, full_first, rows), plain)  # the steps differ, so the delta mattered
    for name, (ids, vectors) in full_last["tables"].items():
        assert torch.equal(delta["tables"][name][0], ids)
        assert torch.equal(delta["tables"][name][1], vectors)
    return sum(len(pa_parquet.read_table(path)) for path in (run_root / "delta/tables").glob("*.evicted.parquet"))


def test_movielens_export_scores_every_validation_row_as_predict_does_and_its_delta_as_a_full_export(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    check_ok(run_recipes(tmp_path, "train", "movielens_small", "-o", "out", *MOVIELENS, timeout=600))
    monkeypatch.chdir(tmp_path)
    export_all(capsys, 10, 20)

    evicted = check_scores_and_delta(capsys, tmp_path, 10, 20, num_rows=MOVIELENS_VALID_ROWS)

    assert evicted == 0  # fixed tables evict nothing
    assert tutorial_scorer().num_lines <= 60  # int8 and int4 dequantised included
    delta_rows = sum(len(pa_parquet.read_table(p)) for p in table_files(tmp_path / "delta"))
    full_rows = sum(len(pa_parquet.read_table(p)) for p in table_files(tmp_path / "full_last"))
    assert 0 < delta_rows < full_rows  # 10 steps of 512 rows touch a fraction of the rows


@pytest.mark.parametrize(
    ("preset", "extra", "evicts"),
    [
        ("dlrm_criteo_tiny", [], False),
        ("dlrm_criteo_tiny_dynamic", SMALL_HASH_TABLES, True),
        ("dlrm_criteo_tiny", DELTA_CHECKPOINTS, False),
        ("dlrm_criteo_tiny_dynamic", [*SMALL_HASH_TABLES, *DELTA_CHECKPOINTS], True),
    ],
)
def test_a_two_rank_run_exports_in_one_process_and_scores_as_predict_does(
    tmp_path: Path,
    preset: str,
    extra: list[str],
    evicts: bool,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    check_ok(run_recipes(tmp_path, "train", preset, "-o", "out", *DLRM, *extra, "--nproc", "2", timeout=600))
    monkeypatch.chdir(tmp_path)
    base = read_metadata(tmp_path / "out" / "checkpoints" / "step_6").base_step
    assert base == (3 if DELTA_CHECKPOINTS[0] in extra else None)
    export_all(capsys, 3, 6)

    evicted = check_scores_and_delta(capsys, tmp_path, 3, 6)

    assert (evicted > 0) == evicts


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    metric = BinaryAUC()
    metric.update(torch.tensor(scores, dtype=torch.float32), torch.tensor(labels, dtype=torch.int64))
    return float(metric.compute())


def test_int8_tables_score_within_0_001_auc_of_predict_in_a_third_of_the_bytes_and_their_delta_applies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    check_ok(run_recipes(tmp_path, "train", "dlrm_criteo_tiny", "-o", "out", *QUANTISED))
    monkeypatch.chdir(tmp_path)
    for dtype in ("float32", "int8", "int4"):
        printed_by_main(capsys, "export", "out", "--checkpoint", "60", "-o", dtype, "--dtype", dtype)
    printed_by_main(capsys, "export", "out", "--checkpoint", "30", "-o", "int8_30", "--dtype", "int8")
    printed_by_main(capsys, "export", "out", "--checkpoint", "60", "--since", "30", "-o", "delta", "--dtype", "int8")
    printed_by_main(capsys, "predict", "out", "--checkpoint", "60", "-o", "predicted.csv")
    predictions = pa_csv.read_csv(tmp_path / "predicted.csv")
    labels = predictions.column("label").to_numpy()
    scorer, rows = tutorial_scorer(), split_rows(tmp_path / "out")

    aucs = {dtype: auc(scores(scorer, scorer.load(tmp_path / dtype), rows), labels) for dtype in ("int8", "int4")}

    expected = auc(predictions.column("score").to_numpy(), labels)
    assert expected > 0.55  # a model that learned something, so that quantisation has an AUC to lose
    assert abs(aucs["int8"] - expected) < 0.001, (aucs, expected)
    assert abs(aucs["int4"] - expected) < 0.02, (aucs, expected)
    for dtype, row_bytes in (("int8", 16 + 4), ("int4", 8 + 4)):
        spec = json.loads((tmp_path / dtype / "model.json").read_text())
        assert {(table["dtype"], table["dim"], table["row_bytes"]) for table in spec["tables"].values()} == {
            (dtype, 16, row_bytes)
        }
    delta = scorer.load(tmp_path / "delta", base=scorer.load(tmp_path / "int8_30"))
    np.testing.assert_array_equal(scores(scorer, delta, rows), scores(scorer, scorer.load(tmp_path / "int8"), rows))
    sizes = {
        dtype: sum(p.stat().st_size for p in table_files(tmp_path / dtype)) for dtype in ("float32", "int8", "int4")
    }
    assert sizes["int4"] < sizes["int8"] < sizes["float32"] / 2.5, sizes


def test_misuse_of_export_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    check_ok(run_recipes(tmp_path, "train", "dlrm_criteo_tiny", "-o", "out", *DLRM))
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken/file").write_text("x")
    cases = [
        (["out", "--since", "4", "-o", "a"], "`--since` must name a checkpoint of out (steps [3, 6]), but step 4"),
        (["out", "--since", "6", "-o", "b"], "`--since` must name a step before the exported 6, but is 6"),
        (["nowhere", "-o", "c"], "OUTPUT_DIR must be a run's output directory, but nowhere has no config.yaml"),
        (["out", "-o", "taken"], "`-o` must be a new or empty folder, but taken is not empty"),
    ]
    monkeypatch.chdir(tmp_path)
    for args, fragment in cases:
        code, _, err = run_main(capsys, "export", *args)
        assert code == 2, err
        assert_one_line_error(err, fragment)
    assert not any((tmp_path / name).exists() for name in ("a", "b", "c"))
    assert [path.name for path in (tmp_path / "taken").iterdir()] == ["file"]
