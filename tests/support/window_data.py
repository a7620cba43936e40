"""Data in windows for the tests of online training: small click logs, one folder per hour or a table with a
time column, and the overrides of the ``tabular`` recipe that read them."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

HOUR_S = 3600
DAY_0 = 1_795_737_600  # 2026-11-27T00:00:00Z
HEADER = "ts,user,item,click"


def click_rows(num_rows: int, seed: int, start_s: int) -> list[tuple[int, int, int, int]]:
    """Rows whose click a user's id predicts (a third of the users click most), at times from ``start_s`` on."""
    rng = random.Random(seed)
    rows = []
    for row in range(num_rows):
        user, item = rng.randrange(30), rng.randrange(50)
        click = int(rng.random() < (0.85 if user % 3 == 0 else 0.1))
        rows.append((start_s + row, user, item, click))
    return rows


def write_hour(root: Path, hour: int, num_rows: int, fmt: str = "csv", done_file: bool = False) -> Path:
    """The window of hour ``hour`` of 2026-11-27: ``root/2026-11-27/hour=HH/part-0.<fmt>`` (two files for an odd
    hour, so that a window of several files is read too)."""
    folder = root / "2026-11-27" / f"hour={hour:02d}"
    folder.mkdir(parents=True, exist_ok=True)
    rows = click_rows(num_rows, seed=hour, start_s=DAY_0 + hour * HOUR_S)
    parts = [rows[: num_rows // 2], rows[num_rows // 2 :]] if hour % 2 else [rows]
    for index, part in enumerate(parts):
        if fmt == "csv":
            text = "".join(f"{ts},{user},{item},{click}\n" for ts, user, item, click in part)
            (folder / f"part-{index}.csv").write_text(HEADER + "\n" + text)
        else:
            columns = dict(zip(HEADER.split(","), (list(column) for column in zip(*part))))
            pq.write_table(pa.table(columns), folder / f"part-{index}.parquet")
    if done_file:
        (folder / "_SUCCESS").write_text("")
    return folder


def write_table(path: Path, hours: int, rows_per_hour: int) -> Path:
    """One CSV table of ``hours`` hours of rows, shuffled (not in time order, as a table of logs may be)."""
    rows = [row for hour in range(hours) for row in click_rows(rows_per_hour, hour, DAY_0 + hour * HOUR_S)]
    random.Random(7).shuffle(rows)
    path.write_text(HEADER + "\n" + "".join(f"{ts},{user},{item},{click}\n" for ts, user, item, click in rows))
    return path


def write_preset(path: Path, train_path: str, valid_path: str, fmt: str = "csv") -> Path:
    """A preset file of the ``tabular`` recipe over the click logs: 32 rows a step, validated at the end only;
    the command line adds the windows."""
    config = {
        "dataset": {
            "train_path": train_path,
            "valid_path": valid_path,
            "format": fmt,
            "label": {"column": "click"},
            "categorical": [{"columns": ["user", "item"], "num_buckets": 64}],
            "batch_size": 32,
        },
        "model": {"name": "logistic_regression"},
        "trainer": {"max_num_steps": None, "max_num_data_epochs": 1, "publish_metrics_every_n_steps": 1},
        "metrics": {"recorders": {"console": False}},
    }
    path.write_text(yaml.safe_dump({"recipe": "tabular", "config": config}))
    return path
