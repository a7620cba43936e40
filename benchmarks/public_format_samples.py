"""Write train/valid/test files in the public CTR formats the tabular presets read, shaped like the real samples.

A user's first try of a preset is a sample of Criteo, Avazu or Frappe; these files stand in for such samples (the
real ones may not be redistributed here). What makes a small real sample hard is how its columns recur, so each
column is drawn to the shape measured on the real files (issue 49): distinct values, the share of them seen once,
the share of test rows whose value never occurs in training. A column's rows take one dominant value, a fresh
value (a near-unique id: it occurs once in the whole draw, so it never recurs in test), or a Zipf-popular value of
a recurring head. Only head and dominant values carry an effect on the click: the near-unique ids carry none that
generalises, so a model that memorises them learns noise.

- ``criteo``: Criteo Kaggle's TSV (label, 13 counts, 26 hashed categoricals as 8-hex-digit strings, no header;
  empty fields where values are missing, at the real shares), 7,200 training rows; the five columns of millions
  of values (C3, C4, C12, C16, C21) near-unique, the hundred-thousands ones (C10, C24, C26) half so, the small
  ones recurring; the signal in the log counts, a few small columns and two weak pairs; about 26% clicks;
- ``avazu``: Avazu's CSV (a header; id, click, hour as YYMMDDHH, 21 categoricals, hex ids and small integers),
  8,087 training rows: ``device_ip`` about 6,100 distinct, 86% seen once, 60% of test values unseen;
  ``device_id`` one value on 87% of the rows and near-unique ids on the rest; ``device_model`` about 1,050 / 44%
  / 6%; ``site_id``, ``site_domain``, ``app_id``, ``C14`` 250-350 values, about 40% seen once, 1-2% unseen;
  ``hour`` a single value; 12 columns of 4 to 32 values, a few of which carry most of the signal; about 17% clicks;
- ``frappe``: the NFM paper's libFM lines (``1`` or ``-1``, then 10 one-hot ``index:1`` fields, global indices:
  user, item, 8 context fields), 50,000 training rows, built as that file was: each logged use (a user, an item,
  a context) is a positive, and two negatives pair its user and context with items drawn uniformly. A user's
  item follows its popularity, a user-item affinity and a context-item affinity.

Every file of a seed comes from one draw, split by rows (train, valid, test in that order).

    python benchmarks/public_format_samples.py OUT_DIR [--rows TRAIN VALID TEST] [--seed 0] [--formats criteo ...]
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class Shape:
    """How a column's values recur, and how much its values move the click's logit."""

    head: int
    """Recurring values, drawn with weight ``(k + 1) ** -exponent``."""
    exponent: float = 1.0
    fresh: float = 0.0
    """Share of rows with a value of their own (a near-unique id), which carries no effect."""
    dominant: float = 0.0
    """Share of rows taking one value (Avazu's ``device_id``)."""
    scale: float = 0.0
    """Standard deviation over the rows of the column's effect on the logit (the head's and the dominant value's
    effects; a fresh value's is 0)."""


# Avazu, in its column order (after id, click and hour): the shapes measured on the real 8,087-row sample.
AVAZU_SHAPES = {
    "C1": Shape(7, 2.5, scale=0.13),
    "banner_pos": Shape(7, 2.5, scale=0.33),
    "site_id": Shape(290, 1.35, fresh=0.013, scale=0.2),
    "site_domain": Shape(240, 1.35, fresh=0.012, scale=0.13),
    "site_category": Shape(26, 1.5, scale=0.45),
    "app_id": Shape(240, 1.35, fresh=0.011, scale=0.2),
    "app_domain": Shape(30, 1.8, scale=0.13),
    "app_category": Shape(30, 1.6, scale=0.39),
    "device_id": Shape(150, 0.8, fresh=0.095, dominant=0.87, scale=0.13),
    "device_ip": Shape(1500, 0.5, fresh=0.6),
    "device_model": Shape(900, 1.0, fresh=0.035, scale=0.1),
    "device_type": Shape(5, 2.5, scale=0.2),
    "device_conn_type": Shape(4, 2.0, scale=0.26),
    "C14": Shape(220, 1.3, fresh=0.01, scale=0.16),
    "C15": Shape(8, 2.5, scale=0.2),
    "C16": Shape(9, 2.5, scale=0.33),
    "C17": Shape(160, 1.2, scale=0.13),
    "C18": Shape(4, 1.0, scale=0.39),
    "C19": Shape(32, 1.4, scale=0.13),
    "C20": Shape(120, 1.3, scale=0.1),
    "C21": Shape(32, 1.4, scale=0.33),
}  # fmt: skip
AVAZU_HEX = {"site_id", "site_domain", "site_category", "app_id", "app_domain", "app_category", "device_id",
             "device_ip", "device_model"}  # fmt: skip
AVAZU_PAIRS = [("site_category", "device_conn_type", 0.2), ("banner_pos", "C18", 0.2), ("app_category", "C16", 0.2)]

# Criteo, C1-C26: millions of values are near-unique in a few thousand rows, hundreds of thousands half so.
_NEAR_UNIQUE, _HALF_UNIQUE = Shape(2000, 0.6, fresh=0.55), Shape(1500, 1.0, fresh=0.2, scale=0.1)
CRITEO_SHAPES = [
    Shape(400, 1.1, scale=0.3), Shape(400, 1.0, scale=0.2), _NEAR_UNIQUE, _NEAR_UNIQUE, Shape(150, 1.3, scale=0.4),
    Shape(24, 1.5, scale=0.6), Shape(1200, 1.0, fresh=0.03, scale=0.1), Shape(150, 1.5, scale=0.2),
    Shape(3, 1.5, scale=0.4), _HALF_UNIQUE, Shape(1200, 1.1, fresh=0.02, scale=0.15), _NEAR_UNIQUE,
    Shape(1000, 1.1, fresh=0.01, scale=0.1), Shape(27, 1.3, scale=0.6), Shape(1200, 1.0, fresh=0.03, scale=0.1),
    _NEAR_UNIQUE, Shape(10, 1.3, scale=0.5), Shape(900, 1.1, fresh=0.01, scale=0.15), Shape(500, 1.2, scale=0.2),
    Shape(4, 1.0, scale=0.4), _NEAR_UNIQUE, Shape(18, 1.5, scale=0.3), Shape(15, 1.3, scale=0.6), _HALF_UNIQUE,
    Shape(105, 1.3, scale=0.3), _HALF_UNIQUE,
]  # fmt: skip
CRITEO_MISSING = [0, 0, 0.03, 0.03, 0, 0.12, 0, 0, 0, 0.03, 0, 0.03, 0, 0, 0, 0.03, 0, 0, 0.44, 0.44, 0.03, 0, 0,
                  0.76, 0, 0.76]  # fmt: skip
CRITEO_COUNT_MISSING = [0.45, 0, 0.21, 0.22, 0.03, 0.22, 0.04, 0, 0.04, 0.45, 0.04, 0.77, 0.22]
CRITEO_PAIRS = [(8, 16, 0.3), (5, 22, 0.3)]  # C9 x C17, C6 x C23

FRAPPE_CARDINALITIES = [957, 4082, 7, 7, 2, 3, 2, 9, 80, 233]  # user, item, daytime, weekday, ... city

DEFAULT_ROWS = {"criteo": [7200, 900, 900], "avazu": [8087, 1011, 1011], "frappe": [50000, 6250, 6250]}


@dataclass
class Column:
    """A categorical column: each row's value index, and its effect on the click's logit."""

    values: npt.NDArray[np.int64]
    effects: npt.NDArray[np.float64]


def draw(rng: np.random.Generator, rows: int, shape: Shape) -> Column:
    """Value 0 is the dominant one, 1 to ``head`` the recurring ones, and each fresh row a value above them."""
    weights = np.arange(1, shape.head + 1, dtype=np.float64) ** -shape.exponent
    values = 1 + rng.choice(shape.head, size=rows, p=weights / weights.sum())
    share = rng.random(rows)
    values[share < shape.dominant] = 0
    fresh = (share >= shape.dominant) & (share < shape.dominant + shape.fresh)
    values[fresh] = shape.head + 1 + np.arange(fresh.sum())
    effects = np.append(rng.normal(0.0, 1.0, size=shape.head + 1), np.zeros(int(fresh.sum())))[values]
    # Scaled over the rows, so that which values happen to be frequent does not make one seed's column mute and
    # another's decide the click.
    spread = effects.std()
    return Column(values.astype(np.int64), effects * (shape.scale / spread if spread > 0 else 0.0))


def pair_effect(rng: np.random.Generator, a: Column, b: Column, scale: float) -> npt.NDArray[np.float64]:
    """An effect of each pair of values, apart from either value's own."""
    _, inverse = np.unique(a.values * 1_000_003 + b.values, return_inverse=True)
    return rng.normal(0.0, scale, size=inverse.max() + 1)[inverse]


def clicks(rng: np.random.Generator, logit: npt.NDArray[np.float64], rate: float) -> npt.NDArray[np.int64]:
    """Bernoulli labels of ``logit`` shifted so that about ``rate`` of the rows click."""
    shift = np.log(rate / (1 - rate)) - np.median(logit)
    for _ in range(30):  # Move the shift until the mean probability is the rate.
        mean = (1 / (1 + np.exp(-(logit + shift)))).mean()
        shift += np.log(rate / (1 - rate)) - np.log(mean / (1 - mean))
    return (rng.random(len(logit)) < 1 / (1 + np.exp(-(logit + shift)))).astype(np.int64)


def criteo(rng: np.random.Generator, rows: int) -> tuple[list[str], str]:
    columns = [draw(rng, rows, shape) for shape in CRITEO_SHAPES]
    logit = sum(col.effects for col in columns) + sum(
        pair_effect(rng, columns[a], columns[b], scale) for a, b, scale in CRITEO_PAIRS
    )
    counts = [np.floor(np.exp(rng.normal(rng.uniform(0, 4), 1.2, size=rows))).astype(np.int64) for _ in range(13)]
    for count, weight in zip(counts, rng.normal(0.0, 0.3, size=13)):
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
    columns = {name: draw(rng, rows, shape) for name, shape in AVAZU_SHAPES.items()}
    logit = sum(col.effects for col in columns.values()) + sum(
        pair_effect(rng, columns[a], columns[b], scale) for a, b, scale in AVAZU_PAIRS
    )
    labels = clicks(rng, logit, 0.17)
    texts = {
        name: [f"{v:08x}" for v in rng.integers(0, 2**32, size=col.values.max() + 1)]
        if name in AVAZU_HEX
        else [str(v) for v in rng.choice(25000, size=col.values.max() + 1, replace=False)]
        for name, col in columns.items()
    }
    lines = []
    for row in range(rows):
        fields = [str(rng.integers(0, 2**63)), str(labels[row]), "14102100"]
        fields.extend(texts[name][col.values[row]] for name, col in columns.items())
        lines.append(",".join(fields))
    return lines, ",".join(["id", "click", "hour", *columns])


def frappe(rng: np.random.Generator, rows: int) -> tuple[list[str], str]:
    logs = -(-rows // 3)
    users = draw(rng, logs, Shape(FRAPPE_CARDINALITIES[0], 0.9)).values - 1
    context = [draw(rng, logs, Shape(card, 0.8)).values - 1 for card in FRAPPE_CARDINALITIES[2:]]
    dim, num_items = 4, FRAPPE_CARDINALITIES[1]
    user_vectors = rng.normal(0, 0.7, size=(FRAPPE_CARDINALITIES[0], dim))
    item_vectors = rng.normal(0, 0.7, size=(num_items, dim))
    context_vectors = [rng.normal(0, 0.4, size=(card, dim)) for card in FRAPPE_CARDINALITIES[2:]]
    popularity = -0.8 * np.log(np.arange(1, num_items + 1))
    items = np.empty(logs, dtype=np.int64)
    for start in range(0, logs, 1000):  # The logged item: a softmax over all items, a chunk of logs at a time.
        end = min(start + 1000, logs)
        taste = user_vectors[users[start:end]] + sum(
            vectors[values[start:end]] for vectors, values in zip(context_vectors, context)
        )
        scores = popularity + taste @ item_vectors.T
        probabilities = np.exp(scores - scores.max(axis=1, keepdims=True))
        cumulative = np.cumsum(probabilities / probabilities.sum(axis=1, keepdims=True), axis=1)
        items[start:end] = (cumulative < rng.random((end - start, 1))).sum(axis=1).clip(max=num_items - 1)
    negatives = rng.integers(0, num_items, size=(logs, 2))
    labels = np.repeat([[1, 0, 0]], logs, axis=0).ravel()
    item_column = np.column_stack([items, negatives]).ravel()
    order = rng.permutation(3 * logs)[:rows]
    offsets = np.cumsum([0, *FRAPPE_CARDINALITIES[:-1]])
    fields = np.column_stack([np.repeat(users, 3), item_column, *(np.repeat(values, 3) for values in context)])
    fields = fields + offsets
    lines = [" ".join(["1" if labels[row] else "-1", *(f"{index}:1" for index in fields[row])]) for row in order]
    return lines, ""


FORMATS: dict[str, tuple[Callable[[np.random.Generator, int], tuple[list[str], str]], str]] = {
    "criteo": (criteo, "txt"),
    "avazu": (avazu, "csv"),
    "frappe": (frappe, "libfm"),
}


def write_samples(out_dir: str, name: str, rows: list[int] | None, seed: int) -> dict[str, str]:
    """Write ``name``'s train, valid and test files of ``rows`` rows each (the real samples' sizes when ``None``);
    return their paths by split."""
    generate, extension = FORMATS[name]
    rows = DEFAULT_ROWS[name] if rows is None else rows
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
    parser.add_argument("--rows", type=int, nargs=3, metavar=("TRAIN", "VALID", "TEST"), help="default: as real")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--formats", nargs="+", choices=list(FORMATS), default=list(FORMATS))
    args = parser.parse_args()
    for name in args.formats:
        for split, path in write_samples(args.out_dir, name, args.rows, args.seed).items():
            print(f"{name} {split}: {path}")


if __name__ == "__main__":
    main()
