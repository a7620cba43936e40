"""The public-format presets train, validate and predict on small files written in those formats.

The public files' licences forbid shipping them, so the tests write rows in each format with a
learnable click signal: the click depends on one categorical column and one count.
"""

from __future__ import annotations

import gzip
import random
from pathlib import Path

import pyarrow.csv as pa_csv
import pytest

from support.cli_runs import checkpoints_listing, printed_by_main, run_main
from support.resume_helpers import check_ok, metric_history, one_line_error, run_recipes

SMALL = ["dataset.batch_size=64", "metrics.recorders.console=false", "trainer.validate_every_n_steps=10"]


def criteo_line(rng: random.Random) -> str:
    hot = rng.randrange(20)
    count = rng.randrange(50)
    click = int(rng.random() < (0.8 if hot < 5 else 0.15) + (0.1 if count > 40 else 0.0))
    dense = [str(count) if i == 0 else ("" if rng.random() < 0.2 else str(rng.randrange(100))) for i in range(13)]
    cats = [f"{hot:08x}"] + [f"{rng.randrange(1 << 32):08x}" if rng.random() < 0.9 else "" for _ in range(25)]
    return "\t".join([str(click), *dense, *cats])


def avazu_line(rng: random.Random, row: int) -> str:
    site = rng.randrange(20)
    click = int(rng.random() < (0.7 if site < 5 else 0.1))
    values = [
        f"{row}",
        str(click),
        f"141021{rng.randrange(24):02d}",
        "1005",
        str(rng.randrange(2)),
        f"site{site:03d}",
        "7e0d2a25",
        "f028772b",
        "ecad2386",
        "7801e8d9",
        "07d7df22",
        f"dev{rng.randrange(500)}",
        f"ip{rng.randrange(1000)}",
        "8a4875bd",
        "1",
        "0",
        *(str(rng.randrange(30)) for _ in range(8)),
    ]
    return ",".join(values)


AVAZU_HEADER = (
    "id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,app_domain,app_category,device_id,"
    "device_ip,device_model,device_type,device_conn_type,C14,C15,C16,C17,C18,C19,C20,C21"
)


def write_frappe(path: Path, num_rows: int, seed: int) -> str:
    """libFM lines as in the NFM paper's Frappe files: a -1/1 label, then one ``idx:1`` per field."""
    rng = random.Random(seed)
    lines = []
    for _ in range(num_rows):
        indices = [field * 100 + rng.randrange(100) for field in range(10)]
        click = rng.random() < (0.8 if indices[0] % 100 < 30 else 0.2)
        lines.append(("1" if click else "-1") + "".join(f" {index}:1" for index in indices) + "\n")
    path.write_text("".join(lines))
    return str(path)


def write_criteo(path: Path, num_rows: int, seed: int) -> str:
    rng = random.Random(seed)
    with gzip.open(path, "wt") as file:
        file.writelines(criteo_line(rng) + "\n" for _ in range(num_rows))
    return str(path)


def write_avazu(path: Path, num_rows: int, seed: int) -> str:
    rng = random.Random(seed)
    path.write_text(AVAZU_HEADER + "\r\n" + "".join(avazu_line(rng, i) + "\r\n" for i in range(num_rows)))
    return str(path)


@pytest.mark.parametrize(
    ("preset", "write"), [("criteo_kaggle", write_criteo), ("avazu", write_avazu), ("frappe", write_frappe)]
)
def test_a_public_format_preset_trains_validates_and_predicts_its_test_split(
    tmp_path: Path, preset: str, write: object, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    suffix = {"criteo_kaggle": ".tsv.gz", "avazu": ".csv", "frappe": ".libfm"}[preset]
    paths = {split: write(tmp_path / f"{split}{suffix}", rows, seed) for seed, (split, rows) in  # type: ignore[operator]
             enumerate((("train", 3000), ("valid", 700), ("test", 500)))}  # fmt: skip
    data = [f"dataset.{split}_path={path}" for split, path in paths.items()]
    if preset == "avazu":
        data.append("dataset.parse_threads=2")  # the key reaches the reader (same rows: test_tabular_reader.py)

    # Validated every 10 steps (SMALL), checkpointed by the preset every epoch: a new best is checkpointed at once.
    check_ok(run_recipes(tmp_path, "train", preset, "-o", "out", *data, *SMALL, timeout=600))
    monkeypatch.chdir(tmp_path)
    if preset == "avazu":  # Writing the predictions over the test data the run reads is refused.
        code, _, err = run_main(capsys, "predict", "out", "--split", "test", "-o", str(paths["test"]))
        assert code == 2 and "must not name a file the run reads" in err
    predicted = printed_by_main(capsys, "predict", "out", "--split", "test", "-o", "predictions.csv")

    valid = metric_history(tmp_path / "out")["valid"]
    assert valid[-1]["auc"] > 0.7
    # Trained until validation stopped improving (early stopping, not the 100 epochs), and scored by the best
    # checkpoint, not the last: `eval` of the valid split repeats that checkpoint's validation.
    listing = checkpoints_listing(tmp_path / "out")
    best_step = int(next(line for line in listing.splitlines() if line.endswith("<- best")).split()[0])
    last_step = max(row["step"] for row in valid)
    assert best_step < last_step and "Early stopping at step" in (tmp_path / "out/logs/rank_0.log").read_text()
    [best] = [row for row in valid if row["step"] == best_step]
    assert f"auc={best['auc']:.6g}" in printed_by_main(capsys, "eval", "out")
    assert {"auc", "log_loss", "ne", "calibration", "pr_auc"} <= set(valid[-1])
    assert "test: auc=" in predicted
    assert pa_csv.read_csv(tmp_path / "predictions.csv").num_rows == 500


def test_a_file_in_the_wrong_format_stops_before_training(tmp_path: Path) -> None:
    train = write_avazu(tmp_path / "train.csv", 200, 0)  # Avazu's CSV given to the Criteo TSV preset
    paths = [f"dataset.train_path={train}", f"dataset.valid_path={train}"]

    result = run_recipes(tmp_path, "train", "criteo_kaggle", "-o", "out", *paths, *SMALL)

    assert result.returncode == 2
    assert "Line 1 of" in one_line_error(result) and "does not fit the schema" in one_line_error(result)
    assert not (tmp_path / "out" / "checkpoints").exists() or not list((tmp_path / "out" / "checkpoints").iterdir())


def test_a_libsvm_preset_checks_its_files_before_training(tmp_path: Path) -> None:
    train = write_avazu(tmp_path / "train.csv", 200, 0)  # a CSV given to the libFM preset
    paths = [f"dataset.train_path={train}", f"dataset.valid_path={train}"]

    result = run_recipes(tmp_path, "train", "frappe", "-o", "out", *paths, *SMALL)

    assert result.returncode == 2
    assert "Line 1 of" in one_line_error(result) and "does not fit the schema" in one_line_error(result)


VOCABULARY_PRESET = """
recipe: tabular
config:
  dataset:
    format: csv
    label: {column: click}
    categorical:
      - {columns: [site_id, device_ip], vocabulary: true, min_count: 2, num_buckets: 1000}
      - {columns: [banner_pos, "C{14..21}"], num_buckets: 1000}
  model: {name: fm}
  trainer: {max_num_steps: 20, validate_every_n_steps: 10, score_metric: auc}
  checkpoint: {every_n_steps: 10}
"""


def test_a_vocabulary_is_built_at_the_first_start_and_loaded_on_resume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "clicks.yaml").write_text(VOCABULARY_PRESET)
    paths = {split: write_avazu(tmp_path / f"{split}.csv", rows, seed) for seed, (split, rows) in
             enumerate((("train", 2000), ("valid", 500)))}  # fmt: skip
    data = [f"dataset.{split}_path={path}" for split, path in paths.items()] + [f"dataset.test_path={paths['valid']}"]

    check_ok(run_recipes(tmp_path, "train", "clicks.yaml", "-o", "out", *data, *SMALL))
    log = tmp_path / "out" / "logs" / "rank_0.log"
    assert "Vocabulary of `site_id`: 20 of 20 distinct values kept" in log.read_text()
    # Appending rows to the training file must not change the ids of a run under way.
    with open(paths["train"], "a") as file:
        file.write("".join(avazu_line(random.Random(9), 10_000 + i) + "\r\n" for i in range(500)))
    check_ok(run_recipes(tmp_path, "train", "out/config.yaml", "-o", "out", "trainer.max_num_steps=30", *SMALL))

    assert "Loaded the vocabularies and counts of site_id, device_ip" in log.read_text()
    monkeypatch.chdir(tmp_path)
    assert "test: auc=" in printed_by_main(capsys, "predict", "out", "--split", "test", "-o", "predictions.csv")
    assert pa_csv.read_csv(tmp_path / "predictions.csv").num_rows == 500
    assert (tmp_path / "out" / "vocabularies.npz").exists()
    assert metric_history(tmp_path / "out")["valid"][-1]["auc"] > 0.7


HISTORY_PRESET = """
recipe: tabular
config:
  dataset:
    label: {column: click}
    split: {column: time, valid_from: 0}
    joins: [{path: items.csv, key: item, columns: [category]}]
    derived: [{name: seen, source: category, transform: history, key: user, length: 10}]
    categorical:
      - {columns: [user, category], num_buckets: 1000}
      - {columns: [seen], multi_hot: true, num_buckets: 100}
  model: {name: fm, embeddings: {dim: 8}}
  trainer: {max_num_steps: 150, validate_every_n_steps: 50, score_metric: auc}
"""


def write_users(path: Path, users: range, rng: random.Random, category_of: list[int]) -> str:
    """Each user mostly picks items of a taste of their own, and clicks exactly those (10% noise): the category of
    an item alone says nothing (every category is clicked as often), the user's earlier categories say all."""
    lines = ["user,item,time,click"]
    for user in users:
        taste = rng.randrange(5)
        for moment in range(20):
            liked = [item for item, category in enumerate(category_of) if category == taste]
            item = rng.choice(liked) if rng.random() < 0.7 else rng.randrange(len(category_of))
            click = int((category_of[item] == taste) != (rng.random() < 0.1))
            lines.append(f"u{user},{item},{moment - 100 if path.stem == 'train' else moment},{click}")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_a_history_over_separate_files_carries_what_new_users_did_before(tmp_path: Path) -> None:
    rng = random.Random(0)
    category_of = [rng.randrange(5) for _ in range(100)]
    (tmp_path / "items.csv").write_text("item,category\n" + "".join(f"{i},c{c}\n" for i, c in enumerate(category_of)))
    (tmp_path / "own.yaml").write_text(HISTORY_PRESET.replace("items.csv", str(tmp_path / "items.csv")))
    # Validation users are new: only their own earlier validation rows, in another file, tell their taste.
    train = write_users(tmp_path / "train.csv", range(200), rng, category_of)
    valid = write_users(tmp_path / "valid.csv", range(200, 260), rng, category_of)

    check_ok(run_recipes(tmp_path, "train", "own.yaml", "-o", "out", f"dataset.train_path={train}",
                         f"dataset.valid_path={valid}", *SMALL))  # fmt: skip

    assert metric_history(tmp_path / "out")["valid"][-1]["auc"] > 0.75
