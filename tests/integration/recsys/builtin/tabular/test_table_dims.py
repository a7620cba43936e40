"""Tables sized by the ids the training files look up: counted at the first start, the same at every later one."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow.csv as pa_csv
import pytest

from support.cli_runs import assert_one_line_error, run_main

PRESET = """
recipe: tabular
config:
  dataset:
    label: {column: click}
    batch_size: 64
    categorical:
      - {columns: [device], vocabulary: true, num_buckets: 100}
      - {columns: [site, item], num_buckets: 5000}
  model: {name: wide_deep, hidden_dims: [16], embeddings: {dim: 16, dim_by_cardinality: true, table_dims: {site: 5}}}
  trainer: {max_num_steps: 20, validate_every_n_steps: 10}
  checkpoint: {every_n_steps: 10}
  metrics: {recorders: {console: false}}
"""


def write_clicks(path: Path, num_rows: int, seed: int, num_items: int = 1000) -> str:
    """3 devices, 20 sites, ``num_items`` items; the click follows the site."""
    rng = random.Random(seed)
    rows = []
    for _ in range(num_rows):
        site = rng.randrange(20)
        click = int(rng.random() < (0.8 if site < 5 else 0.2))
        rows.append(f"{click},d{rng.randrange(3)},s{site},i{rng.randrange(num_items)}\n")
    path.write_text("click,device,site,item\n" + "".join(rows))
    return str(path)


def table_dims(log: str) -> dict[str, int]:
    """Each vector table's dim, from the start-up report's ``sparse table 'NAME' (...): R rows x DIM`` lines."""
    dims = {}
    for line in log.splitlines():
        if "sparse table '" in line and "first_order_" not in line:
            name = line.split("sparse table '")[1].split("'")[0]
            dims[name] = int(line.split(" rows x ")[1].split(",")[0])
    return dims


def test_tables_are_sized_by_their_counted_ids_and_keep_their_dims_when_the_files_grow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "clicks.yaml").write_text(PRESET)
    train = write_clicks(tmp_path / "train.csv", 2000, seed=0)
    valid = write_clicks(tmp_path / "valid.csv", 300, seed=1)
    paths = [f"dataset.train_path={train}", f"dataset.valid_path={valid}", f"dataset.test_path={valid}"]

    code, _, err = run_main(capsys, "train", "clicks.yaml", "-o", "out", *paths)
    assert code == 0, err

    # 3 devices (vocabulary ids 2-4); 20 sites and about 870 of 1,000 items in 2,000 rows, hashed into 5,000 rows
    # (values that share a row count once). 6 * C ** 0.25 dims, at most 16; the site's dim is the config's own.
    counted = json.loads((tmp_path / "out" / "cardinalities.json").read_text())
    assert counted["device"] == 3 and 18 <= counted["site"] <= 20 and 700 < counted["item"] <= 1000
    log = tmp_path / "out" / "logs" / "rank_0.log"
    assert table_dims(log.read_text()) == {"device": 8, "site": 5, "item": 16}

    # Rows of new devices appended to the training file: a resumed run and predict build the tables trained.
    with open(train, "a") as file:
        file.write("".join(f"1,new{i},s1,i1\n" for i in range(500)))
    code, _, err = run_main(capsys, "train", "out/config.yaml", "-o", "out", "trainer.max_num_steps=30")
    assert code == 0, err
    assert "Loaded the tables' counted ids" in log.read_text()
    code, out, err = run_main(capsys, "predict", "out", "--split", "test", "-o", "predictions.csv")
    assert code == 0 and "test: auc=" in out, err
    assert pa_csv.read_csv(tmp_path / "predictions.csv").num_rows == 300


@pytest.mark.parametrize(
    ("override", "fragments"),
    [
        ("model.name=deepfm", ["`model.embeddings.dim_by_cardinality` must be used with a model whose", "'deepfm'"]),
        ("model.embeddings.table_dims={device: 4, sites: 4}", ["must name the model's tables", "names sites instead"]),
    ],
)
def test_sizes_a_model_cannot_take_stop_the_run_before_any_pass_over_the_data(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    override: str,
    fragments: list[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "clicks.yaml").write_text(PRESET)
    train = write_clicks(tmp_path / "train.csv", 200, seed=0)
    paths = [f"dataset.train_path={train}", f"dataset.valid_path={train}"]

    code, _, err = run_main(capsys, "train", "clicks.yaml", "-o", "out", *paths, override)

    assert code == 2
    assert_one_line_error(err, *fragments)
    assert (
        not (tmp_path / "out" / "vocabularies.npz").exists() and not (tmp_path / "out" / "cardinalities.json").exists()
    )
