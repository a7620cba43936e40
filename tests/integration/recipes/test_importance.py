"""``python -m recipes importance``: from a trained run, the table of every feature's AUC drop and NE rise (the
determining feature first, noise at zero), its CSV and TensorBoard chart, the same for a seed; every misuse one line."""

from __future__ import annotations

from pathlib import Path

import pyarrow.csv as pa_csv
import pytest

from recipes.cli.main import main
from support.cli_runs import assert_one_line_error, printed_by_main, run_main
from support.paths import ROOT
from support.resume_helpers import check_ok, run_recipes, tensorboard_scalars
from support.signal_noise import register_signal_noise

TINY = ["trainer.max_num_steps=20", "trainer.validate_every_n_steps=20", "metrics.recorders.console=false"]
CTR_FEATURES = {f"cat_{i}" for i in range(4)} | {f"dense_{i}" for i in range(4)}


@pytest.fixture(scope="module")
def ctr_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ctr_importance")
    check_ok(run_recipes(root, "train", "ctr_tiny", "-o", "out", *TINY))
    return root


def table_rows(stdout: str) -> list[list[str]]:
    """The printed table's feature lines: rank, feature, auc_drop, ne_rise."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["rank", "feature"]) + 1
    return [line.split() for line in lines[start:] if line.strip() and line.split()[0].isdigit()]


def baseline(stdout: str) -> dict[str, float]:
    line = next(line for line in stdout.splitlines() if line.startswith("baseline: "))
    return {key: float(value) for key, value in (pair.split("=") for pair in line.split()[1:])}


def read_csv(path: Path) -> dict[str, list[object]]:
    table = pa_csv.read_csv(path)
    return {name: table.column(name).to_pylist() for name in table.column_names}


def test_importance_prints_the_features_by_auc_drop_from_evals_baseline_and_writes_them(
    ctr_run: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (ctr_run / "tables").mkdir(exist_ok=True)  # -o makes no folder: a misspelt one is refused.
    monkeypatch.chdir(ctr_run)
    printed = printed_by_main(capsys, "importance", "out", "--checkpoint", "best", "-o", "tables/imp.csv")
    evaluated = printed_by_main(capsys, "eval", "out", "--checkpoint", "best")

    rows = table_rows(printed)
    assert {row[1] for row in rows} == CTR_FEATURES and [row[0] for row in rows] == [str(i) for i in range(1, 9)]
    drops = [float(row[2]) for row in rows]
    assert drops == sorted(drops, reverse=True) and drops[0] > 0.01
    eval_line = next(line for line in evaluated.splitlines() if line.startswith("valid: "))
    values = dict(pair.split("=") for pair in eval_line.split()[1:])
    assert baseline(printed) == pytest.approx({"auc": float(values["auc"]), "ne": float(values["ne"])}, abs=1e-5)
    assert "8,192 rows" in printed and "Wrote the table to tables/imp.csv." in printed

    table = read_csv(ctr_run / "tables" / "imp.csv")
    assert list(table) == ["rank", "feature", "auc_drop", "ne_rise", "auc", "ne"]
    assert table["feature"] == [row[1] for row in rows]
    assert table["auc_drop"] == pytest.approx(drops, abs=1e-6)
    auc_plus_drop = [auc + drop for auc, drop in zip(table["auc"], table["auc_drop"], strict=True)]  # type: ignore[operator]
    assert auc_plus_drop == pytest.approx([baseline(printed)["auc"]] * 8, abs=1e-6)
    assert not list((ctr_run / "tables").glob("*.tmp-*"))


def test_a_seed_gives_the_same_table_and_chart_and_another_seed_another(
    ctr_run: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ctr_run)
    first = printed_by_main(capsys, "importance", "out", "-o", "seed0.csv")
    # In a new interpreter: the same seed gives the same table in another process too (no set or hash order).
    again = check_ok(run_recipes(ctr_run, "importance", "out", "-o", "again.csv", "--seed", "0"))
    other = printed_by_main(capsys, "importance", "out", "-o", "seed1.csv", "--seed", "1")

    assert table_rows(first) == table_rows(again.stdout)
    assert (ctr_run / "seed0.csv").read_bytes() == (ctr_run / "again.csv").read_bytes()
    seed0, seed1 = read_csv(ctr_run / "seed0.csv"), read_csv(ctr_run / "seed1.csv")
    assert baseline(first) == baseline(other)
    by_feature = [dict(zip(t["feature"], t["auc"], strict=True)) for t in (seed0, seed1)]  # type: ignore[arg-type]
    assert by_feature[0] != by_feature[1]

    # The chart is the latest run's (seed 1) only: a point per rank, the drops in the table's order.
    chart = tensorboard_scalars(ctr_run / "out", "importance_valid", "importance/auc_drop")
    assert [step for step, _ in chart] == list(range(1, 9))
    assert [value for _, value in chart] == pytest.approx(seed1["auc_drop"], abs=1e-6)


def test_the_feature_that_determines_the_label_ranks_first_and_noise_drops_nothing(
    isolated_presets: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    register_signal_noise()
    assert main(["train", "signal_noise", "-o", "run"]) == 0
    capsys.readouterr()

    code, out, err = run_main(capsys, "importance", "run", "--checkpoint", "best")

    assert code == 0, err
    rows = table_rows(out)
    assert rows[0][1] == "signal" and float(rows[0][2]) > 0.3 and float(rows[0][3]) > 0.3
    assert {row[1] for row in rows[1:]} == {"noise", "tags", "dense_0"}
    for _, feature, auc_drop, ne_rise in rows[1:]:
        assert abs(float(auc_drop)) < 0.02 and abs(float(ne_rise)) < 0.05, feature
    assert baseline(out)["auc"] > 0.85


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--split", "test"], ["`--split` must be a split the recipe has data for (valid), but is 'test'"]),
        (["--checkpoint", "999"], ["`--checkpoint` must be auto, last, best or one of the steps [20], but is '999'"]),
        (["-o", "table.txt"], ["`-o` must end in .csv or .parquet, but is table.txt"]),
        (["-o", "out/config.yaml/table.csv"], ["`-o` must be a writable file, but out/config.yaml/table.csv"]),
        (["--nproc", "2"], ["`--nproc` must be left out, but is 2"]),
    ],
)
def test_a_misuse_is_one_line_and_exit_2_before_any_work(
    ctr_run: Path,
    args: list[str],
    fragments: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(ctr_run)
    code, out, err = run_main(capsys, "importance", "out", *args)

    assert code == 2 and not out
    assert_one_line_error(err, *fragments)
    assert not (ctr_run / "out" / "tb" / "importance_test").exists()


def test_a_missing_run_directory_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(capsys, "importance", str(tmp_path / "runs" / "never"))

    assert code == 2
    assert_one_line_error(err, "must be a run's output directory (or a preset), but is not: it does not exist")


def test_a_recipe_whose_batches_do_not_offer_sparse_features_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tutorial's matrix factorisation reads ``(SparseFeatures, clicks)`` tuples: no field to replace."""
    out = str(tmp_path / "mf")
    check_ok(run_recipes(ROOT, "train", "mf_movielens", "-o", out, "trainer.max_num_steps=2", *TINY[2:]))
    monkeypatch.chdir(ROOT)

    code, _, err = run_main(capsys, "importance", out)

    assert code == 2
    assert_one_line_error(err, "a dataclass with its SparseFeatures in a `sparse` field", "but is a tuple instead")


def test_an_eval_unit_without_auc_and_ne_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = str(tmp_path / "linreg")
    check_ok(run_recipes(ROOT, "train", "linreg_demo", "-o", out, "trainer.max_num_steps=2", *TINY[2:]))
    monkeypatch.chdir(ROOT)

    code, _, err = run_main(capsys, "importance", out)

    assert code == 2
    assert_one_line_error(err, "must report the metrics ['auc', 'ne'], but reports ['mse'] instead")
