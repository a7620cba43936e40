"""Components from another package, through its entry points only: tests/plugin_package installed, and trained with.

The package adds one component of each kind the framework names in configs: a data format (``jsonl``), a zoo model
(``gelu_mlp``), a recorder (``csv_log``), a sparse optimizer (``soft_sgd``) and an eviction policy (``mru``).
Nothing imports it: it is installed (not editable) into a folder put on the path of ``python -m recipes``, whose
registries load each entry point the first time a config names its component.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from support.paths import PLUGIN_PACKAGE
from support.resume_helpers import metric_history

PRESET = """
plugin_run:
  recipe: tabular
  config:
    dataset:
      train_path: train.jsonl
      valid_path: valid.jsonl
      format: jsonl
      label: {column: click}
      categorical: [{columns: [user, item], num_buckets: 40}]
      dense: [{columns: [age]}]
      batch_size: 64
    model:
      name: gelu_mlp
      activation_scale: 1.5
      embeddings:
        dim: 8
        kind: hash
        sparse_optimizer: {name: soft_sgd, lr: 0.05, softness: 0.01}
        hash: {eviction: mru}
    metrics:
      recorders: {csv_log: {enabled: true, file_name: plugin.csv}, console: false}
    trainer: {max_num_steps: 60, validate_every_n_steps: 30, publish_metrics_every_n_steps: 30}
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The plugin package installed into a folder of its own, as pip installs any package."""
    target = tmp_path_factory.mktemp("site")
    build = tmp_path_factory.mktemp("build")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(PLUGIN_PACKAGE),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "TMPDIR": str(build)},
    )
    assert result.returncode == 0, result.stderr
    assert list(target.glob("recipes_plugin-*.dist-info/entry_points.txt"))
    return target


def write_rows(path: Path, num_rows: int, seed: int) -> None:
    """Clicks that follow the item's parity, items that fit their hash table, users that do not: it evicts."""
    generator = random.Random(seed)
    with path.open("w") as file:
        for _ in range(num_rows):
            user, item = generator.randrange(300), generator.randrange(30)
            click = int(item % 2 == 0) if generator.random() < 0.9 else int(item % 2 == 1)
            file.write(json.dumps({"click": click, "user": user, "item": item, "age": generator.random()}) + "\n")


def test_each_component_of_an_installed_package_trains(installed: Path, tmp_path: Path) -> None:
    write_rows(tmp_path / "train.jsonl", 4000, seed=0)
    write_rows(tmp_path / "valid.jsonl", 1000, seed=1)
    (tmp_path / "recipes.yaml").write_text(PRESET)
    env = {**os.environ, "PYTHONPATH": str(installed)}

    result = subprocess.run(
        [sys.executable, "-m", "recipes", "train", "plugin_run", "-o", "out"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip

    assert result.returncode == 0, result.stderr
    out = tmp_path / "out"
    report = [line for line in result.stdout.splitlines() if line.startswith("sparse table 'user'")]
    assert report and "soft_sgd lr=0.05" in report[0] and "eviction mru" in report[0]  # optimizer, policy
    logged = (out / "plugin.csv").read_text().splitlines()  # the recorder
    assert "train,60,loss," in "\n".join(logged) and any(line.startswith("valid,60,auc,") for line in logged)
    history = metric_history(out)
    assert history["train"][-1]["hash_tables/user/evicted"] > 0  # the table was full: mru chose what to evict
    auc = history["valid"][-1]["auc"]
    assert auc > 0.7, f"the jsonl rows through gelu_mlp reached a validation AUC of only {auc:.3f}"
