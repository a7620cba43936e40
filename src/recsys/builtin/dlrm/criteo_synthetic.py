"""Writes synthetic click logs in the raw Criteo format, for tests, demos and benchmarks.

The rows are not noise: the label is drawn from a logistic function of the categories of the
first three categorical features and of the first two integer features, so a model that
learns beats chance (the Bayes AUC is well above 0.5). Categories follow a skewed (Zipf-like)
popularity, as real ones do, and every feature is empty at ``empty_rate``. Output is plain, or
gzip when the path ends in ``.gz``; any fsspec path works. The same seed writes the same lines.

    python -m recsys.builtin.dlrm.criteo_synthetic day_0.gz --num-rows 100000 --seed 0
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import fsspec
import numpy as np
import numpy.typing as npt

from recsys.builtin.dlrm.criteo import NUM_DENSE_FEATURES, NUM_SPARSE_FEATURES

_SIGNAL_FEATURES = 3
_ROWS_PER_CHUNK = 65_536
_MALFORMED_KINDS = ("field_count", "number", "label")


def write_synthetic_criteo(
    path: str,
    num_rows: int,
    seed: int = 0,
    *,
    empty_rate: float = 0.05,
    categories_per_feature: int = 1000,
    num_malformed: int = 0,
    model_seed: int = 0,
) -> None:
    """Writes ``num_rows`` well-formed rows and ``num_malformed`` malformed lines among them.

    ``seed`` draws the rows; ``model_seed`` draws the hidden click model that labels them, so
    files of different seeds and one model seed are train and validation sets of one task.

    The malformed lines (a wrong field count, a count that is no number, a label other than 0/1,
    in turn) sit at seeded random places.
    """
    if num_rows < 0 or num_malformed < 0:
        raise ValueError(
            f"`num_rows` and `num_malformed` must be non-negative, but are {num_rows} and {num_malformed} instead."
        )
    if not 0.0 <= empty_rate < 1.0:
        raise ValueError(f"`empty_rate` must be in [0, 1), but is {empty_rate} instead.")
    if categories_per_feature < 1:
        raise ValueError(f"`categories_per_feature` must be at least 1, but is {categories_per_feature} instead.")

    weights = np.random.default_rng([model_seed, 0]).normal(0.0, 1.5, (_SIGNAL_FEATURES, categories_per_feature))
    num_lines = num_rows + num_malformed
    malformed_lines = np.sort(np.random.default_rng([seed, 1]).choice(num_lines, num_malformed, replace=False))
    malformed_kinds = {
        int(line): _MALFORMED_KINDS[rank % len(_MALFORMED_KINDS)] for rank, line in enumerate(malformed_lines)
    }
    with fsspec.open(path, "wt", compression="infer", newline="\n") as file:
        for chunk_index, first in enumerate(range(0, num_lines, _ROWS_PER_CHUNK)):
            rng = np.random.default_rng([seed, 2, chunk_index])
            lines = _synthetic_lines(rng, min(_ROWS_PER_CHUNK, num_lines - first), weights, empty_rate)
            for line in malformed_lines[(malformed_lines >= first) & (malformed_lines < first + len(lines))]:
                lines[line - first] = _break_line(lines[line - first], malformed_kinds[int(line)])
            file.write("\n".join(lines))
            file.write("\n")


def _synthetic_lines(
    rng: np.random.Generator, num_rows: int, weights: npt.NDArray[np.float64], empty_rate: float
) -> list[str]:
    categories_per_feature = weights.shape[1]
    # Zipf-like popularity: category k is drawn with probability proportional to 1 / (k + 1).
    popularity = 1.0 / np.arange(1, categories_per_feature + 1)
    categories = rng.choice(categories_per_feature, (num_rows, NUM_SPARSE_FEATURES), p=popularity / popularity.sum())
    sparse_empty = rng.random((num_rows, NUM_SPARSE_FEATURES)) < empty_rate
    dense = np.floor(np.exp(rng.normal(1.0, 1.5, (num_rows, NUM_DENSE_FEATURES)))).astype(np.int64)
    dense[rng.random((num_rows, NUM_DENSE_FEATURES)) < 0.01] = -1  # Criteo has a few negative values.
    dense_empty = rng.random((num_rows, NUM_DENSE_FEATURES)) < empty_rate

    logits = np.full(num_rows, -0.3)
    for feature in range(_SIGNAL_FEATURES):
        logits += np.where(sparse_empty[:, feature], 0.0, weights[feature, categories[:, feature]])
    log_dense = np.log1p(np.maximum(dense[:, :2], 0)) * ~dense_empty[:, :2]
    logits += 0.5 * (log_dense[:, 0] - 1.2) - 0.5 * (log_dense[:, 1] - 1.2)
    labels = (rng.random(num_rows) < 1.0 / (1.0 + np.exp(-logits))).astype(np.int64)

    # A bijection of (feature, category) onto 32-bit hashes, distinct within each feature.
    hashes = (categories * 2654435761 + np.arange(NUM_SPARSE_FEATURES) * 40503 + 12345) % (1 << 32)
    columns = [[str(label) for label in labels]]
    for column in range(NUM_DENSE_FEATURES):
        columns.append(["" if e else str(v) for v, e in zip(dense[:, column], dense_empty[:, column])])
    for column in range(NUM_SPARSE_FEATURES):
        columns.append(["" if e else f"{h:08x}" for h, e in zip(hashes[:, column], sparse_empty[:, column])])
    return ["\t".join(fields) for fields in zip(*columns)]


def _break_line(line: str, kind: str) -> str:
    fields = line.split("\t")
    if kind == "field_count":
        return "\t".join(fields[:-1])
    if kind == "number":
        fields[1] = "1.5x"
    else:
        fields[0] = "2"
    return "\t".join(fields)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m recsys.builtin.dlrm.criteo_synthetic",
        description="Write synthetic click logs in the raw Criteo format (gzip if PATH ends in .gz).",
    )
    parser.add_argument("path", help="output file: a local path or any fsspec URL")
    parser.add_argument("--num-rows", type=int, required=True, help="number of well-formed rows")
    parser.add_argument("--seed", type=int, default=0, help="the same seed writes the same lines (default: 0)")
    parser.add_argument("--empty-rate", type=float, default=0.05, help="share of empty fields (default: 0.05)")
    parser.add_argument(
        "--categories-per-feature", type=int, default=1000, help="distinct hashes per feature (default: 1000)"
    )
    parser.add_argument(
        "--num-malformed", type=int, default=0, help="malformed lines to mix in, for tests (default: 0)"
    )
    parser.add_argument(
        "--model-seed",
        type=int,
        default=0,
        help="seed of the hidden click model; share it between train and validation files (default: 0)",
    )
    args = parser.parse_args(argv)
    try:
        write_synthetic_criteo(
            args.path,
            args.num_rows,
            args.seed,
            empty_rate=args.empty_rate,
            categories_per_feature=args.categories_per_feature,
            num_malformed=args.num_malformed,
            model_seed=args.model_seed,
        )
    except ValueError as error:
        parser.error(str(error))


if __name__ == "__main__":
    main()
