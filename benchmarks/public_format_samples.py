"""Write train/valid/test files in the public CTR formats the tabular presets read, with their statistics.

A user's first try of a preset is a sample of Criteo, Avazu or Frappe; these files stand in for such samples (the
real ones may not be redistributed here). Each is drawn from a known model, so that what is learnable is known:

- ``criteo``: Criteo Kaggle's TSV (label, 13 counts, 26 hashed categoricals as 8-hex-digit strings, no header;
  empty fields where values are missing), the real data's cardinalities per column (scaled to the rows), Zipf
  popular values, about 26% clicks;
- ``avazu``: Avazu's CSV (a header; id, click, hour as YYMMDDHH, 21 categoricals, hex ids and small integers),
  about 17% clicks;
- ``frappe``: the NFM paper's libFM lines (``1`` or ``-1``, then 10 one-hot ``index:1`` fields, global indices),
  one positive to two negatives, a user-item affinity the first-order terms cannot express alone.

The click probability is a logistic model of per-value effects (some columns informative, some noise), a few pair
interactions and, for Criteo, the log counts; values rarer than the data can teach carry effects too, as real ids
do. Every file of a seed comes from one draw, split by rows (train, valid, test in that order).

    python benchmarks/public_format_samples.py OUT_DIR [--rows 8000 1000 1000] [--seed 0] [--formats criteo ...]
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

# Criteo Kaggle's cardinality per categorical column (of 45.8M rows), and the share of rows where it is empty.
CRITEO_CARDINALITIES = [
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
]  # fmt: skip
CRITEO_MISSING = [
    0,
    0,
    0.03,
    0.03,
    0,
    0.12,
    0,
    0,
    0,
    0.03,
    0,
    0.03,
    0,
    0,
    0,
    0.03,
    0,
    0,
    0.44,
    0.44,
    0.03,
    0,
    0,
    0.76,
    0,
    0.76,
]
CRITEO_COUNT_MISSING = [0.45, 0, 0.21, 0.22, 0.03, 0.22, 0.04, 0, 0.04, 0.45, 0.04, 0.77, 0.22]

AVAZU_COLUMNS = ["site_id", "site_domain", "site_category", "app_id", "app_domain", "app_category", "device_id",
                 "device_ip", "device_model"]  # fmt: skip
AVAZU_CARDINALITIES = {
    "C1": 7, "banner_pos": 7, "site_id": 4737, "site_domain": 7745, "site_category": 26, "app_id": 8552,
    "app_domain": 559, "app_category": 36, "device_id": 2686408, "device_ip": 6729486, "device_model": 8251,
    "device_type": 5, "device_conn_type": 4, "C14": 2626, "C15": 8, "C16": 9, "C17": 435, "C18": 4, "C19": 68,
    "C20": 172, "C21": 60,
}  # fmt: skip

FRAPPE_CARDINALITIES = [957, 4082, 7, 7, 2, 3, 2, 9, 80, 233]  # user, item, daytime, weekday, ... city


@dataclass
class Column:
    """A categorical column: value indices drawn Zipf-popular, and each value's effect on the click's logit."""

    values: npt.NDArray[np.int64]
    effects: npt.NDArray[np.float64]


def zipf_indices(rng: np.random.Generator, rows: int, cardinality: int, exponent: float = 1.1) -> npt.NDArray[np.int64]:
    """Indices in [0, cardinality), index k drawn with weight (k + 1) ** -exponent, as popular ids are."""
    if cardinality <= 1_000_000:
        weights = np.arange(1, cardinality + 1, dtype=np.float64) ** -exponent
        return rng.choice(cardinality, size=rows, p=weights / weights.sum()).astype(np.int64)
    # A long tail too large to tabulate: Zipf draws folded into the range.
    return ((rng.zipf(exponent + 0.2, size=rows) - 1) % cardinality).astype(np.int64)


def column(rng: np.random.Generator, rows: int, cardinality: int, scale: float) -> Column:
    values = zipf_indices(rng, rows, cardinality)
    used, inverse = np.unique(values, return_inverse=True)
    effects = rng.normal(0.0, scale, size=len(used))[inverse]
    return Column(values, effects)


def pair_effect(rng: np.random.Generator, a: Column, b: Column, scale: float) -> npt.NDArray[np.float64]:
    """An effect of each pair of values, apart from either value's own."""
    keys = a.values * 1_000_003 + b.values
    _, inverse = np.unique(keys, return_inverse=True)
    return rng.normal(0.0, scale, size=inverse.max() + 1)[inverse]


def clicks(rng: np.random.Generator, logit: npt.NDArray[np.float64], rate: float) -> npt.NDArray[np.int64]:
    """Bernoulli labels of ``logit`` shifted so that about ``rate`` of the rows click."""
    shift = np.log(rate / (1 - rate)) - np.median(logit)
    for _ in range(30):  # Move the shift until the mean probability is the rate.
        mean = (1 / (1 + np.exp(-(logit + shift)))).mean()
        shift += np.log(rate / (1 - rate)) - np.log(mean / (1 - mean))
    return (rng.random(len(logit)) < 1 / (1 + np.exp(-(logit + shift)))).astype(np.int64)


def criteo(rng: np.random.Generator, rows: int) -> tuple[list[str], str]:
    scales = rng.choice([0.0, 0.3, 0.6, 0.9], size=26, p=[0.3, 0.3, 0.25, 0.15])
    columns = [column(rng, rows, max(c, 2), s) for c, s in zip(CRITEO_CARDINALITIES, scales)]
    logit = sum(col.effects for col in columns) + pair_effect(rng, columns[0], columns[5], 0.6)
    logit += pair_effect(rng, columns[8], columns[16], 0.5)
    counts = [np.floor(np.exp(rng.normal(rng.uniform(0, 4), 1.2, size=rows))).astype(np.int64) for _ in range(13)]
    weights = rng.normal(0.0, 0.25, size=13)
    for count, weight in zip(counts, weights):
        logit += weight * (np.log1p(count) - np.log1p(count).mean())
    labels = clicks(rng, logit, 0.256)
    hex_of = [rng.integers(0, 2**32, size=col.values.max() + 1) for col in columns]
    lines = []
    for row in range(rows):
        fields = [str(labels[row])]
        for count, missing in zip(counts, CRITEO_COUNT_MISSING):
            fields.append("" if rng.random() < missing else str(count[row]))
        for col, hexes, missing in zip(columns, hex_of, CRITEO_MISSING):
            fields.append("" if rng.random() < missing else f"{hexes[col.values[row]]:08x}")
        lines.append("\t".join(fields))
    return lines, ""


def avazu(rng: np.random.Generator, rows: int) -> tuple[list[str], str]:
    names = list(AVAZU_CARDINALITIES)
    columns = {
        name: column(rng, rows, card, scale)
        for name, card, scale in zip(
            names, AVAZU_CARDINALITIES.values(), rng.choice([0.0, 0.3, 0.6, 0.9], size=len(names))
        )
    }
    hours = rng.integers(0, 240, size=rows)  # ten days of hours
    hour_effect = 0.3 * np.sin(2 * np.pi * (hours % 24) / 24)
    logit = sum(col.effects for col in columns.values()) + hour_effect
    logit += pair_effect(rng, columns["site_id"], columns["device_model"], 0.6)
    logit += pair_effect(rng, columns["app_id"], columns["C14"], 0.6)
    labels = clicks(rng, logit, 0.17)
    hex_of = {name: rng.integers(0, 2**32, size=columns[name].values.max() + 1) for name in AVAZU_COLUMNS}
    ints_of = {name: rng.integers(0, 25000, size=columns[name].values.max() + 1) for name in names}
    lines = []
    for row in range(rows):
        hour = hours[row]
        fields = [str(rng.integers(0, 2**63)), str(labels[row]), f"1410{21 + hour // 24:02d}{hour % 24:02d}"]
        for name in names:
            index = columns[name].values[row]
            fields.append(f"{hex_of[name][index]:08x}" if name in hex_of else str(ints_of[name][index]))
        lines.append(",".join(fields))
    header = ",".join(["id", "click", "hour", *names])
    return lines, header


def frappe(rng: np.random.Generator, rows: int) -> tuple[list[str], str]:
    offsets = np.cumsum([0, *FRAPPE_CARDINALITIES[:-1]])
    users, items = (column(rng, rows, card, 0.8) for card in FRAPPE_CARDINALITIES[:2])
    context = [column(rng, rows, card, 0.3) for card in FRAPPE_CARDINALITIES[2:]]
    dim = 4
    user_vectors = rng.normal(0, 0.8, size=(FRAPPE_CARDINALITIES[0], dim))
    item_vectors = rng.normal(0, 0.8, size=(FRAPPE_CARDINALITIES[1], dim))
    affinity = np.einsum("rd,rd->r", user_vectors[users.values], item_vectors[items.values])
    logit = users.effects + items.effects + sum(col.effects for col in context) + 1.5 * affinity
    labels = clicks(rng, logit, 1 / 3)
    lines = []
    for row in range(rows):
        indices = [users.values[row], items.values[row], *(col.values[row] for col in context)]
        fields = [f"{offset + index}:1" for offset, index in zip(offsets, indices)]
        lines.append(" ".join(["1" if labels[row] else "-1", *fields]))
    return lines, ""


FORMATS: dict[str, tuple[Callable[[np.random.Generator, int], tuple[list[str], str]], str]] = {
    "criteo": (criteo, "txt"),
    "avazu": (avazu, "csv"),
    "frappe": (frappe, "libfm"),
}


def write_samples(out_dir: str, name: str, rows: list[int], seed: int) -> dict[str, str]:
    """Write ``name``'s train, valid and test files of ``rows`` rows each; return their paths by split."""
    generate, extension = FORMATS[name]
    lines, header = generate(np.random.default_rng(seed), sum(rows))
    os.makedirs(out_dir, exist_ok=True)
    paths, start = {}, 0
    for split, count in zip(("train", "valid", "test"), rows):
        path = os.path.join(out_dir, f"{name}_{split}.{extension}")
        with open(path, "w") as file:
            if header:
                file.write(header + "\n")
            file.write("\n".join(lines[start : start + count]) + "\n")
        paths[split], start = path, start + count
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--rows", type=int, nargs=3, default=[8000, 1000, 1000], metavar=("TRAIN", "VALID", "TEST"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--formats", nargs="+", choices=list(FORMATS), default=list(FORMATS))
    args = parser.parse_args()
    for name in args.formats:
        for split, path in write_samples(args.out_dir, name, args.rows, args.seed).items():
            print(f"{name} {split}: {path}")


if __name__ == "__main__":
    main()
