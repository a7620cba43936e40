"""The generated public-format samples (benchmarks/public_format_samples.py) have the column shapes measured on the
real samples (issue 49): near-unique ids that do not recur in test, a dominant value, small informative columns.
A preset is judged on these files (benchmarks/preset_quality.py), so a sample that drifts from the real shapes
would rank the models as the real files do not. The bands hold over seeds."""

from __future__ import annotations

import csv
import sys
from collections import Counter
from pathlib import Path

import pytest

from support.paths import BENCHMARKS

sys.path.insert(0, str(BENCHMARKS))

from public_format_samples import write_samples


def shape(train: list[str], test: list[str]) -> tuple[int, float, float, float]:
    """Distinct values in training, the share of them seen once, the share of test values never in training, and
    the share of training rows of the most frequent value."""
    counts = Counter(train)
    once = sum(1 for count in counts.values() if count == 1) / len(counts)
    unseen = sum(1 for value in test if value not in counts) / len(test)
    return len(counts), once, unseen, max(counts.values()) / len(train)


SPLITS = ("train", "test")


def avazu_columns(path: str) -> dict[str, list[str]]:
    with open(path, newline="") as file:
        header, *rows = list(csv.reader(file))
    return {name: [row[i] for row in rows] for i, name in enumerate(header)}


@pytest.mark.parametrize("seed", [0, 1])
def test_avazu_columns_recur_as_the_real_sample_s(tmp_path: Path, seed: int) -> None:
    paths = write_samples(str(tmp_path), "avazu", None, seed)
    train, test = avazu_columns(paths["train"]), avazu_columns(paths["test"])
    assert len(train["click"]) == 8087
    assert 0.15 < sum(map(int, train["click"])) / 8087 < 0.19

    distinct, once, unseen, _ = shape(train["device_ip"], test["device_ip"])
    assert 5500 < distinct < 6800 and 0.8 < once < 0.92 and 0.55 < unseen < 0.7
    distinct, once, unseen, top = shape(train["device_id"], test["device_id"])
    assert 750 < distinct < 1000 and 0.85 < once < 0.97 and 0.06 < unseen < 0.14 and 0.85 < top < 0.89
    distinct, once, unseen, _ = shape(train["device_model"], test["device_model"])
    assert 900 < distinct < 1250 and 0.38 < once < 0.5 and 0.03 < unseen < 0.1
    for name in ("site_id", "site_domain", "app_id", "C14"):
        distinct, once, unseen, _ = shape(train[name], test[name])
        assert 220 < distinct < 420 and 0.28 < once < 0.5 and 0.003 < unseen < 0.04, name
    assert len(set(train["hour"])) == 1
    small = [name for name, values in train.items() if name not in ("id", "click") and 4 <= len(set(values)) <= 32]
    assert len(small) == 12


def test_criteo_ids_of_millions_of_values_are_near_unique_and_the_small_columns_recur(tmp_path: Path) -> None:
    paths = write_samples(str(tmp_path), "criteo", None, 0)
    train, test = ([line.split("\t") for line in Path(paths[split]).read_text().splitlines()] for split in SPLITS)
    assert len(train) == 7200 and all(len(row) == 40 for row in train + test)
    assert 0.23 < sum(int(row[0]) for row in train) / len(train) < 0.29
    assert 0.4 < sum(row[1] == "" for row in train) / len(train) < 0.5  # I1: 45% missing
    for column in range(14, 40):
        values, test_values = ([row[column] for row in rows if row[column]] for rows in (train, test))
        distinct, once, unseen, _ = shape(values, test_values)
        if column - 13 in (3, 4, 12, 16, 21):  # C3, C4, C12, C16, C21: millions of values in the full data
            assert once > 0.8 and unseen > 0.55, column
        elif column - 13 in (6, 9, 14, 17, 20, 22, 23):  # C6, C9, C14, C17, C20, C22, C23: 3 to 27 values
            assert distinct <= 27 and unseen == 0, column


def test_frappe_has_one_positive_to_two_negatives_over_its_fields_ranges(tmp_path: Path) -> None:
    paths = write_samples(str(tmp_path), "frappe", None, 0)
    lines = [line.split() for line in Path(paths["train"]).read_text().splitlines()]
    assert len(lines) == 50000 and {line[0] for line in lines} == {"1", "-1"}
    assert abs(sum(line[0] == "1" for line in lines) / len(lines) - 1 / 3) < 0.01
    fields = [[int(token.split(":")[0]) for token in line[1:]] for line in lines]
    starts = [0, 957, 5039, 5046, 5053, 5055, 5058, 5060, 5069, 5149, 5382]  # user, item, 8 context fields
    for field in range(10):
        values = {row[field] for row in fields}
        assert starts[field] <= min(values) and max(values) < starts[field + 1], field
    users, items = ({row[field] for row in fields} for field in (0, 1))
    assert len(users) > 500 and len(items) > 2000
