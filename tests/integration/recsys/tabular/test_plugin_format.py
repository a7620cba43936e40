"""A data format from another package, end to end: the tabular recipe trains on files in ``tests/plugin_package``'s
``jsonl`` format, the package's module imported from its folder (``tests/unit/recsys/tabular/test_plugin_format.py``
checks the rows and ids it reads)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from recipes.cli.main import main
from support.plugin_format import write_lines

JSONL_PRESET = """
recipe: tabular
config:
  dataset:
    format: jsonl
    label: {column: click}
    dense: [{columns: [count], log: true}]
    categorical: [{columns: [site], num_buckets: 100}]
    batch_size: 16
  model: {name: logistic_regression}
  trainer: {max_num_steps: 6, validate_every_n_steps: 3}
  checkpoint: {every_n_steps: null}
  metrics: {recorders: {console: false, tensorboard: false}}
"""


@pytest.mark.usefixtures("plugin")
def test_the_tabular_recipe_trains_on_jsonl_files(isolated_presets: Path) -> None:
    clicks = [{"click": int(site < 3), "count": site * 10, "site": f"s{site}"} for site in range(8)] * 8
    train = write_lines(isolated_presets / "train.jsonl", clicks)
    valid = write_lines(isolated_presets / "valid.jsonl", clicks[:16])
    (isolated_presets / "clicks.yaml").write_text(JSONL_PRESET)

    code = main(["train", "clicks.yaml", "-o", "out", f"dataset.train_path={train}", f"dataset.valid_path={valid}"])

    assert code == 0
    valid_lines = (isolated_presets / "out" / "metrics" / "valid.jsonl").read_text().splitlines()
    assert len(valid_lines) == 2 and "auc" in json.loads(valid_lines[-1])
    # An export names the ids by their texts for a format of another package too (its reader is an ArrowReader).
    assert main(["export", "out", "-o", "served"]) == 0
    values = pq.read_table(isolated_presets / "served" / "tables" / "first_order_site.values.parquet")
    assert sorted(values.column("value").to_pylist()) == [f"s{site}" for site in range(8)]
