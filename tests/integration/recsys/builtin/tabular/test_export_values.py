"""``export`` writes, beside each table of text-valued features, the texts behind its ids: looked up by a row's
text, they give the ids the run's own readers give that row (fixed and hash tables, hashed, vocabulary, multi-hot
and joined columns; runs of 1 and 2 ranks)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow.csv as pa_csv
import pyarrow.parquet as pa_parquet
import pytest

from support.cli_runs import assert_one_line_error, run_main
from support.resume_helpers import check_ok, run_recipes
from support.serving_scorer import split_rows

PRESET = """
recipe: tabular
config:
  dataset:
    label: {column: click}
    batch_size: 32
    joins: [{path: items.csv, key: item, columns: [brand]}]
    categorical:
      - {columns: [user, brand], num_buckets: 50}
      - {columns: [city], vocabulary: true, min_count: 2, num_buckets: 10}
      - {columns: [tags], separator: "|", num_buckets: 30}
  model: {name: wide_deep, hidden_dims: [8], embeddings: {dim: 4}}
  trainer: {max_num_steps: 6, validate_every_n_steps: 6}
  checkpoint: {every_n_steps: 6}
  metrics: {recorders: {console: false}}
"""


def write_rows(path: Path, num_rows: int, seed: int) -> None:
    """Users ``u0``..``u59`` (more than the 50 rows: some share one), 12 cities (the rare ones out of the vocabulary),
    0-3 tags with stray spaces, items of 5 brands; an empty field now and then."""
    rng = random.Random(seed)
    lines = ["click,user,city,tags,item"]
    for _ in range(num_rows):
        tags = "|".join(f" t{rng.randrange(8)} " for _ in range(rng.randrange(4)))
        city = "" if rng.random() < 0.1 else f"city {min(rng.randrange(20), 11)}"
        lines.append(f"{rng.randrange(2)},u{rng.randrange(60)},{city},{tags},i{rng.randrange(10)}")
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize(("kind", "ranks"), [("fixed", "1"), ("hash", "2")])
def test_the_texts_beside_the_ids_give_the_ids_the_readers_give(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], kind: str, ranks: str
) -> None:
    monkeypatch.chdir(tmp_path)  # The config's paths are relative, as a user writes them.
    (tmp_path / "clicks.yaml").write_text(PRESET)
    (tmp_path / "items.csv").write_text("item,brand\n" + "".join(f"i{i},brand {i % 5}\n" for i in range(10)))
    write_rows(tmp_path / "train.csv", 400, seed=0)
    write_rows(tmp_path / "valid.csv", 200, seed=1)
    data = ["dataset.train_path=train.csv", "dataset.valid_path=valid.csv", f"model.embeddings.kind={kind}"]
    if ranks == "1":  # In this process: a new interpreter would only import torch again.
        code, _, err = run_main(capsys, "train", "clicks.yaml", "-o", "out", *data)
        assert code == 0, err
    else:
        check_ok(run_recipes(tmp_path, "train", "clicks.yaml", "-o", "out", *data, "--nproc", ranks))
    code, _, err = run_main(capsys, "export", "out", "-o", "served")
    assert code == 0, err

    spec = json.loads((tmp_path / "served" / "model.json").read_text())
    table_of = {put["feature"]: put["table"] for put in spec["inputs"] if not put["table"].startswith("first_order")}
    texts = {}
    for feature, table in table_of.items():
        values = pa_parquet.read_table(tmp_path / "served" / spec["tables"][table]["values"]).to_pylist()
        assert {row["feature"] for row in values} == {feature}
        texts[feature] = {row["value"]: row["id"] for row in values}
    assert sorted(texts["brand"]) == [f"brand {b}" for b in range(5)]  # from the side table
    assert "city 11" in texts["city"] and texts["city"]["city 11"] >= 2  # the frequent cities have their own ids

    # The validation rows' text, mapped by the export, against the ids the run's readers give the same rows.
    raw = pa_csv.read_csv(tmp_path / "valid.csv", convert_options=pa_csv.ConvertOptions(strings_can_be_null=False))
    brand_of = {f"i{i}": f"brand {i % 5}" for i in range(10)}
    rows = [
        {
            "user": [user],
            "city": [city] if city else [],
            "tags": [t.strip() for t in tags.split("|") if t],
            "brand": [brand_of[item]],
        }
        for user, city, tags, item in zip(*(raw.column(c).to_pylist() for c in ("user", "city", "tags", "item")))
    ]
    read = [
        {name: features[name][0][features[name][1][i] : features[name][1][i + 1]].tolist() for name in table_of}
        for _, features in split_rows(tmp_path / "out")
        for i in range(len(features["user"][1]) - 1)
    ]
    assert len(read) == len(rows) == 200
    checked = 0
    for row, ids in zip(rows, read):
        for feature, values in row.items():
            if feature == "city" and values and values[0] not in texts["city"]:
                assert ids[feature] == [1]  # out of the vocabulary
            elif all(value in texts[feature] for value in values):
                assert sorted(ids[feature]) == sorted(texts[feature][v] for v in values) or (
                    not values and ids[feature] == [0]
                )
                checked += 1
    assert checked > 600

    # Without the pass over the training files: no values files, and model.json says so.
    code, _, err = run_main(capsys, "export", "out", "-o", "plain", "--no-values")
    assert code == 0, err
    plain = json.loads((tmp_path / "plain" / "model.json").read_text())
    assert all(table["values"] is None for table in plain["tables"].values())
    assert not list((tmp_path / "plain" / "tables").glob("*.values.parquet"))

    (tmp_path / "train.csv").rename(tmp_path / "moved.csv")  # The recipe's readers, and the pass, open the files.
    code, _, err = run_main(capsys, "export", "out", "-o", "after_move")
    assert code == 2 and not (tmp_path / "after_move").exists()
    assert_one_line_error(err, "holds no such file", "train.csv")
