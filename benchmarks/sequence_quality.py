"""Do the sequence and retrieval models beat their baselines on the shipped MovieLens data? Trained in one run, on
one split, several seeds each.

Two parts (``--parts``):

- ``din``: the ``movielens_din`` preset (DIN: the candidate movie attends over the user's latest 50 movies)
  against the best pooled-history zoo models on the very same columns, the movie history declared ``multi_hot``
  (pooled by its mean, in the same table): ``mlp`` with DIN's MLP, and ``wide_deep`` (``movielens_small``'s model).
  The valid AUC of the last validation.
- ``retrieval``: ``movielens_sasrec`` and ``movielens_two_tower`` (the movie of each validation rating ranked among
  every movie), against the most-popular ranking (every movie by its number of training ratings, no training):
  HR@10, NDCG@10 and HR@50 (recall@50) of the last validation.

Each trained row runs once per seed, one after the other, in a fresh output directory; figures are mean ± std over
the seeds. The last lines compare, as issue 47 asks: ``din_gap`` (DIN minus the best pooled model, with the seeds'
largest std), ``sasrec_vs_popular`` and ``two_tower_recall50_vs_popular`` (ratios), ``sasrec_vs_two_tower``:

    python benchmarks/sequence_quality.py [--parts din retrieval] [--seeds 0 1 2] [--epochs N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np

from recipes.cli.job import resolve_job
from recipes.cli.job_spec import JobSpec
from recsys.tabular.cardinality import count_feature_ids
from recsys.tabular.formats.data_format import data_format
from recsys.tabular.schema import TabularDataSection, resolve_path, with_full_keys
from recsys.tabular.vocabulary import Encodings

POOLED_HISTORY = (
    "dataset.categorical=[{columns: [userId, movieId], num_buckets: 50000}, {columns: [hour, weekday], num_buckets: "
    "1000}, {columns: [genres], separator: '|', num_buckets: 1000}, {columns: [genre_history], multi_hot: true, "
    "num_buckets: 1000}, {columns: [tag], multi_hot: true, num_buckets: 20000}, {columns: [movie_history], "
    "multi_hot: true, same_ids_as: movieId}]"
)


@dataclass(frozen=True)
class Setting:
    name: str
    preset: str
    overrides: tuple[str, ...] = ()


DIN_SETTINGS = [
    Setting("din", "movielens_din"),
    Setting("mlp, history pooled", "movielens_din", ("model.name=mlp", "model.hidden_dims=[200,80]", POOLED_HISTORY)),
    Setting(
        "wide_deep, history pooled",
        "movielens_din",
        ("model.name=wide_deep", "model.hidden_dims=[512,256]", POOLED_HISTORY),
    ),
]
RETRIEVAL_SETTINGS = [Setting("sasrec", "movielens_sasrec"), Setting("two_tower", "movielens_two_tower")]


@dataclass(frozen=True)
class Row:
    setting: Setting
    values: list[dict[str, float]]

    def mean(self, key: str) -> float:
        return statistics.mean(value[key] for value in self.values)

    def std(self, key: str) -> float:
        return statistics.stdev(value[key] for value in self.values) if len(self.values) > 1 else 0.0


def last_validation(output_dir: str) -> dict[str, float]:
    with open(os.path.join(output_dir, "metrics", "valid.jsonl")) as f:
        records = [json.loads(line) for line in f if line.strip()]
    if not records:
        raise RuntimeError(f"The run in {output_dir} recorded no validation.")
    return {key: float(value) for key, value in records[-1].items() if isinstance(value, (int, float))}


def train_row(setting: Setting, seeds: list[int], epochs: int | None, root: str) -> Row:
    values = []
    for seed in seeds:
        output_dir = os.path.join(root, f"{setting.preset}_{len(os.listdir(root))}")
        extra = [f"trainer.max_num_data_epochs={epochs}"] if epochs else []
        command = [sys.executable, "-m", "recipes", "train", setting.preset, "-o", output_dir, f"seed={seed}"]
        run = subprocess.run([*command, *setting.overrides, *extra], capture_output=True, text=True)
        if run.returncode:
            raise RuntimeError(f"The {setting.name} run of seed {seed} failed:\n{run.stderr[-3000:]}")
        values.append(last_validation(output_dir))
        print(f"{setting.name} seed={seed}: {values[-1]}", file=sys.stderr, flush=True)
    return Row(setting, values)


def most_popular(preset: str, top_k: list[int]) -> dict[str, float]:
    """HR@K and NDCG@K of ranking every movie by its number of training ratings, over the preset's validation
    rows (the rank: how many other movies have more training ratings)."""
    data: TabularDataSection = resolve_job(JobSpec(preset)).config.dataset  # type: ignore[attr-defined]
    files = data_format(with_full_keys(data))  # Every movie its own id, as the presets' hash tables have them.
    assert data.train_path is not None and data.valid_path is not None
    options = {"batch_size": 65_536, "shuffle": False, "drop_last": False}
    paths = list(dict.fromkeys(resolve_path(p) for p in (data.train_path, data.valid_path, data.test_path) if p))
    orders = files.reader(paths, split="all", encodings=None, batch_size=1).row_orders()
    encodings = Encodings({}, {}, orders.histories, ranks=orders.ranks)
    item = "movieId"
    ids, counts = count_feature_ids(
        files.reader(resolve_path(data.train_path), split="train", encodings=encodings, **options), item
    )
    valid_ids, valid_counts = count_feature_ids(
        files.reader(resolve_path(data.valid_path), split="valid", encodings=encodings, **options), item
    )
    at = np.searchsorted(ids, valid_ids).clip(max=len(ids) - 1)
    own = np.where(ids[at] == valid_ids, counts[at], 0)
    sorted_counts = np.sort(counts)
    ranks = len(counts) - np.searchsorted(sorted_counts, own, side="right")  # items with more training ratings
    weights = valid_counts / valid_counts.sum()
    result = {}
    for k in top_k:
        result[f"hr@{k}"] = float((weights * (ranks < k)).sum())
        result[f"ndcg@{k}"] = float((weights * np.where(ranks < k, 1 / np.log2(ranks + 2), 0.0)).sum())
    return result


def table(rows: list[Row], keys: list[str], extra: dict[str, dict[str, float]] | None = None) -> str:
    lines = [f"| model | {' | '.join(keys)} | seeds |", "|---" * (len(keys) + 2) + "|"]
    for row in rows:
        cells = [f"{row.mean(key):.4f} ± {row.std(key):.4f}" for key in keys]
        lines.append(f"| {row.setting.name} | {' | '.join(cells)} | {len(row.values)} |")
    for name, values in (extra or {}).items():
        lines.append(f"| {name} | {' | '.join(f'{values[key]:.4f}' for key in keys)} | - |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", choices=["din", "retrieval"], default=["din", "retrieval"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=None, help="override the presets' epochs")
    args = parser.parse_args()
    start = time.perf_counter()
    summary = []
    with tempfile.TemporaryDirectory() as root:
        if "din" in args.parts:
            rows = [train_row(setting, args.seeds, args.epochs, root) for setting in DIN_SETTINGS]
            print(table(rows, ["auc", "gauc"]))
            best = max(rows[1:], key=lambda row: row.mean("auc"))
            spread = max(row.std("auc") for row in rows)
            summary.append(f"din_gap={rows[0].mean('auc') - best.mean('auc'):+.4f} spread={spread:.4f}")
        if "retrieval" in args.parts:
            rows = [train_row(setting, args.seeds, args.epochs, root) for setting in RETRIEVAL_SETTINGS]
            popular = most_popular(RETRIEVAL_SETTINGS[0].preset, [10, 50])
            print(table(rows, ["hr@10", "ndcg@10", "hr@50"], {"most popular": popular}))
            sasrec, two_tower = rows
            summary.append(
                f"sasrec_vs_popular={sasrec.mean('hr@10') / max(popular['hr@10'], 1e-9):.2f} "
                f"sasrec_vs_two_tower={sasrec.mean('hr@10') / max(two_tower.mean('hr@10'), 1e-9):.2f} "
                f"two_tower_recall50_vs_popular={two_tower.mean('hr@50') / max(popular['hr@50'], 1e-9):.2f}"
            )
    print(f"\n{len(args.seeds)} seeds; the last validation's figures; {time.perf_counter() - start:.0f} s in all.")
    print("\n".join(summary))


if __name__ == "__main__":
    main()
