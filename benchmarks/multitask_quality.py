"""Does one model of two tasks lose either task? ``movielens_multitask``'s heads against single-task models.

``movielens_multitask`` learns, on ``movielens_small``'s columns and time split, rating >= 4 (the ``liked`` task,
binary, valid AUC) and the rating itself (the ``rating`` task, regression, valid MSE) with one MMoE. Each head is
measured against a model of one task of the same family trained in the same run on the same split: an MMoE of one
task is an MLP (one expert, one gate of weight 1, one tower), so each single-task model is the ``mlp`` of the
multi-task model's widths (its experts' hidden layers, dropout and tables), with

- ``liked``: ``movielens_small``'s columns and its binary ``label`` (rating >= 4);
- ``rating``: the same columns with the one regression task of ``labels``.

Each row runs once per seed, one run after the other, each in a fresh output directory; its metric is the last
validation's (``metrics/valid.jsonl``), mean ± std over the seeds. The last line compares the heads with their
single-task models: ``binary_gap`` (multi-task AUC less single-task AUC; the goal: >= -0.002) and ``mse_ratio``
(multi-task MSE over single-task MSE; the goal: <= 1.01)::

    python benchmarks/multitask_quality.py [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from movielens_quality import last_validation

PRESET = "movielens_multitask"

# The single-task models: the multi-task MMoE's widths, as an MLP (see the module's docstring).
SINGLE_TASK_MLP = [
    "model=mlp",
    "model.hidden_dims=[512,256]",
    "model.dropout=0.3",
    "model.embeddings.dim=32",
    "model.embeddings.sparse_optimizer.lr=0.1",
]
ROWS: dict[str, tuple[str, list[str]]] = {
    "multi-task (the preset)": (PRESET, []),
    "liked alone": ("movielens_small", SINGLE_TASK_MLP),
    "rating alone": (
        PRESET,
        [
            "dataset.labels=[{column: rating, kind: regression}]",
            *SINGLE_TASK_MLP,
            "trainer.score_metric=valid/rating/mse",
            "metrics.group_by=null",  # GAUC is a binary task's metric.
        ],
    ),
}


@dataclass(frozen=True)
class Row:
    name: str
    command: str
    metrics: dict[str, list[float]]
    seconds: float

    def shown(self, key: str) -> str:
        values = self.metrics.get(key)
        if not values:
            return ""
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        return f"{statistics.mean(values):.4f} ± {std:.4f}"


def train_row(name: str, preset: str, overrides: list[str], seeds: list[int], root: str) -> Row:
    """One row: a training run per seed, each in a fresh directory; the binary AUC and the MSE of each."""
    metrics: dict[str, list[float]] = {"liked/auc": [], "rating/mse": []}
    start = time.perf_counter()
    for seed in seeds:
        output_dir = os.path.join(root, f"{name.split()[0]}_seed{seed}")
        command = [sys.executable, "-m", "recipes", "train", preset, "-o", output_dir, f"seed={seed}", *overrides]
        run = subprocess.run(command, capture_output=True, text=True)
        if run.returncode:
            raise RuntimeError(f"The {name} run of seed {seed} failed:\n{run.stderr[-3000:]}")
        record = last_validation(output_dir)
        # movielens_small's one label keeps the bare metric names: its AUC is the liked task's.
        found = {"liked/auc": record.get("liked/auc", record.get("auc")), "rating/mse": record.get("rating/mse")}
        for key, value in found.items():
            if value is not None:
                metrics[key].append(value)
        print(f"{name} seed={seed}: {found}", file=sys.stderr, flush=True)
    shown = " ".join(repr(text) if " " in text else text for text in overrides)
    command_text = f"python -m recipes train {preset} seed=S {shown}".rstrip()
    return Row(name, command_text, metrics, (time.perf_counter() - start) / len(seeds))


def markdown_table(rows: list[Row]) -> str:
    lines = ["| model | liked: valid AUC | rating: valid MSE | s a run | command |", "|---|---:|---:|---:|---|"]
    for row in rows:
        auc, mse = row.shown("liked/auc"), row.shown("rating/mse")
        lines.append(f"| {row.name} | {auc} | {mse} | {row.seconds:.0f} | `{row.command}` |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as root:
        rows = [train_row(name, preset, overrides, args.seeds, root) for name, (preset, overrides) in ROWS.items()]
    print(markdown_table(rows))
    print(f"\n{len(args.seeds)} seeds; the last validation's metrics; {time.perf_counter() - start:.0f} s in all.")
    multi, liked, rating = rows
    gap = statistics.mean(multi.metrics["liked/auc"]) - statistics.mean(liked.metrics["liked/auc"])
    ratio = statistics.mean(multi.metrics["rating/mse"]) / statistics.mean(rating.metrics["rating/mse"])
    print(f"binary_gap={gap:+.4f} mse_ratio={ratio:.4f}")


if __name__ == "__main__":
    main()
