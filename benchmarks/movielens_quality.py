"""Does the zoo beat the simple baselines on the shipped MovieLens data? Valid AUC of ``movielens_small``.

The preset splits ml-latest-small by time (the latest 20% of ratings validate), and only about 17% of
the validation rows have a user seen in training: ids alone stall near 0.68-0.69, so a deep model is
worth shipping only if the other columns (genres, tags, popularity, time) lift it clearly above what
a linear model, a bias model or plain popularity reach on the very same split. Four rows:

- ``zoo``: the preset as shipped (its model, every column);
- ``logistic_regression``: a weight per id and per dense feature, on the same columns;
- ``user_item_bias``: logistic regression on ``userId`` and ``movieId`` alone;
- ``item_popularity``: no training; each validation row scored by its movie's number of training
  ratings, read through the project's own reader, so that the split is exactly the preset's.

Each trained row runs once per seed, sequentially, each run in a fresh output directory; its AUC is the
last validation's, at the end of training (``metrics/valid.jsonl``), as mean ± std over the seeds.
The last line compares the zoo with the best baseline:

    python benchmarks/movielens_quality.py [--seeds 0 1 2]
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

import torch
from torchmetrics.functional.classification import binary_auroc

from recipes.cli.job import resolve_job
from recipes.cli.job_spec import JobSpec
from recsys.tabular.formats.delimited_text import TabularReader
from recsys.tabular.schema import TabularDataSection, resolve_path
from recsys.tabular.vocabulary import load_or_build_encodings

PRESET = "movielens_small"

# The linear rows, tuned as fairly as the zoo: each the best final valid AUC (mean of seeds 0-2) of a small grid,
# one axis at a time. Logistic regression: the tables' rowwise Adagrad lr in {0.1, 0.3, 1.0}, optimizer.lr (AdamW:
# the dense weights and the bias) in {0.001, 0.003, 0.01, 0.03}, {1, 2, 3} epochs. The bias model (optimizer.lr
# moves only its global bias): table lr in {0.1, 0.3, 1.0}, {1, 2, 3} epochs.
LOGISTIC_REGRESSION = [
    "model.name=logistic_regression",
    "optimizer.lr=0.001",
    "model.embeddings.sparse_optimizer.lr=0.3",
    "trainer.max_num_data_epochs=2",
]
USER_ITEM_BIAS = [
    "model.name=logistic_regression",
    "optimizer.lr=0.01",
    "model.embeddings.sparse_optimizer.lr=0.3",
    "trainer.max_num_data_epochs=1",
    "dataset.categorical=[{columns: [userId, movieId], num_buckets: 50000}]",
    "dataset.dense=[]",
    "dataset.joins=[]",
    "dataset.derived=[]",
]
TRAINED_ROWS: dict[str, list[str]] = {
    "zoo": [],
    "logistic_regression": LOGISTIC_REGRESSION,
    "user_item_bias": USER_ITEM_BIAS,
}


@dataclass(frozen=True)
class Row:
    name: str
    model: str
    aucs: list[float]
    command: str

    @property
    def mean(self) -> float:
        return statistics.mean(self.aucs)

    @property
    def std(self) -> float:
        return statistics.stdev(self.aucs) if len(self.aucs) > 1 else 0.0


def train_command(overrides: list[str], seed: int, output_dir: str) -> list[str]:
    """The command line of one training run of the preset."""
    return [sys.executable, "-m", "recipes", "train", PRESET, "-o", output_dir, f"seed={seed}", *overrides]


def last_validation(output_dir: str) -> dict[str, float]:
    """The metrics of the run's last validation, by name."""
    with open(os.path.join(output_dir, "metrics", "valid.jsonl")) as f:
        records = [json.loads(line) for line in f if line.strip()]
    if not records:
        raise RuntimeError(f"The run in {output_dir} recorded no validation.")
    return {key: float(value) for key, value in records[-1].items()}


def final_auc(output_dir: str) -> float:
    """The valid AUC of the run's last validation."""
    return last_validation(output_dir)["auc"]


def train_row(name: str, overrides: list[str], seeds: list[int], root: str) -> Row:
    """One trained row: a run per seed, one after the other, each in a fresh directory."""
    aucs = []
    for seed in seeds:
        output_dir = os.path.join(root, f"{name}_seed{seed}")
        run = subprocess.run(train_command(overrides, seed, output_dir), capture_output=True, text=True)
        if run.returncode:
            raise RuntimeError(f"The {name} run of seed {seed} failed:\n{run.stderr[-3000:]}")
        aucs.append(final_auc(output_dir))
        print(f"{name} seed={seed}: valid auc={aucs[-1]:.4f}", file=sys.stderr, flush=True)
    shown = " ".join(repr(text) if " " in text else text for text in overrides)
    command = f"python -m recipes train {PRESET} seed=S {shown}".rstrip()
    model = resolve_job(JobSpec(PRESET, overrides=overrides)).config.model.name  # type: ignore[attr-defined]
    return Row(name, model, aucs, command)


def popularity_auc(root: str) -> float:
    """The valid AUC of scoring each validation row by its movie's number of training ratings."""
    # The preset's split and joins, with the raw count of training ratings as the only dense column.
    overrides = ["dataset.dense=[{columns: [movie_ratings]}]"]
    data: TabularDataSection = resolve_job(JobSpec(PRESET, overrides=overrides)).config.dataset  # type: ignore[attr-defined]
    assert data.train_path is not None and data.valid_path is not None
    train_path, valid_path = resolve_path(data.train_path), resolve_path(data.valid_path)
    encodings = load_or_build_encodings(
        os.path.join(root, "popularity_counts.npz"),
        data,
        lambda: TabularReader(train_path, data, split="train", batch_size=1).count_values(),
    )
    reader = TabularReader(
        valid_path, data, split="valid", encodings=encodings, batch_size=4096, shuffle=False, drop_last=False
    )
    scores, labels = [], []
    for batches in reader:
        for batch in batches:
            scores.append(batch.dense[:, 0])
            labels.append(batch.labels)
    # Scaled into [0, 1]: torchmetrics takes scores outside it for logits, whose sigmoid ties every count above ~17.
    counts = torch.cat(scores).double()
    return float(binary_auroc(counts / counts.max().clamp(min=1), torch.cat(labels).long()))


def markdown_table(rows: list[Row], popularity: float) -> str:
    lines = ["| row | model | valid AUC (mean ± std) | seeds | command |", "|---|---|---|---|---|"]
    for row in rows:
        seeds = len(row.aucs)
        lines.append(f"| {row.name} | {row.model} | {row.mean:.4f} ± {row.std:.4f} | {seeds} | `{row.command}` |")
    lines.append(f"| item_popularity | (none) | {popularity:.4f} | - | `python benchmarks/movielens_quality.py` |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as root:
        rows = [train_row(name, overrides, args.seeds, root) for name, overrides in TRAINED_ROWS.items()]
        popularity = popularity_auc(root)
    print(markdown_table(rows, popularity))
    print(f"\n{len(args.seeds)} seeds; AUC of the last validation; {time.perf_counter() - start:.0f} s in all.")
    zoo = rows[0].mean
    best_baseline = max([*(row.mean for row in rows[1:]), popularity])
    print(f"best_zoo={zoo:.4f} best_baseline={best_baseline:.4f} margin={zoo - best_baseline:.4f}")


if __name__ == "__main__":
    main()
