"""Does each public-format preset learn from a user's files? Its test AUC beside a tuned logistic regression's.

A user's first try is ``python -m recipes train criteo_kaggle -o OUT dataset.train_path=... valid_path=...
test_path=...`` on a sample, then ``eval OUT --split test``. This runs exactly that per preset and seed (the preset
and the paths, nothing tuned) and scores the test split with the checkpoint ``eval`` takes by default. The
baseline is written in plain torch, apart from the project's readers and zoo: every ``column=value`` (Criteo's
counts as values too, as the usual hashed LR does) hashed into 2^20 weights, Adagrad, batch 256, the epoch (of 20)
and the learning rate (0.01, 0.03, 0.1) chosen on the validation file, scored on the test file.

    python benchmarks/preset_quality.py --preset criteo_kaggle --train T --valid V --test S [--seeds 0 1 2]
    python benchmarks/preset_quality.py --generated OUT_DIR [--rows 8000 1000 1000] [--seeds 0 1 2]
    python benchmarks/preset_quality.py --generated OUT_DIR -- model.dropout=0.3   # overrides for every train

``--generated`` writes the files with ``benchmarks/public_format_samples.py`` (one draw per seed, of the real
samples' sizes unless ``--rows``) and runs all three presets. Prints a line per preset and seed and, per preset,
the mean and standard deviation over the seeds: ``preset_auc= lr_auc= gap=`` (the gap's spread is that of the
per-seed gaps).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torchmetrics.functional.classification import binary_auroc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from public_format_samples import write_samples

PRESET_OF_FORMAT = {"criteo": "criteo_kaggle", "avazu": "avazu", "frappe": "frappe"}
FORMAT_OF_PRESET = {preset: name for name, preset in PRESET_OF_FORMAT.items()}
BUCKETS = 1 << 20


@dataclass(frozen=True)
class Files:
    train: str
    valid: str
    test: str


def preset_test_auc(preset: str, files: Files, seed: int, work_dir: str, overrides: list[str]) -> float:
    """Train ``preset`` on the files as a user would (with ``overrides``), then ``eval --split test``; the test
    AUC."""
    output_dir = os.path.join(work_dir, f"{preset}_seed{seed}")
    paths = [
        f"dataset.train_path={files.train}",
        f"dataset.valid_path={files.valid}",
        f"dataset.test_path={files.test}",
    ]
    for command in (
        ["train", preset, "-o", output_dir, *paths, f"seed={seed}", "metrics.recorders.console=false", *overrides],
        ["eval", output_dir, "--split", "test"],
    ):
        result = subprocess.run([sys.executable, "-m", "recipes", *command], capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(f"{' '.join(command[:2])} failed: {result.stderr.strip()[-2000:]}")
    with open(os.path.join(output_dir, "metrics", "eval_test.jsonl")) as file:
        return float([json.loads(line) for line in file if line.strip()][-1]["auc"])


def rows(path: str, name: str) -> Iterator[tuple[float, list[str]]]:
    """A file's rows as (label, tokens): ``column=value`` for every non-empty value."""
    with open(path) as file:
        if name == "avazu":
            header = next(file).rstrip("\n").split(",")
        for line in file:
            if name == "criteo":
                fields = line.rstrip("\n").split("\t")
                yield float(fields[0]), [f"{k}={v}" for k, v in enumerate(fields[1:]) if v]
            elif name == "avazu":
                fields = line.rstrip("\n").split(",")
                values = dict(zip(header, fields))
                label = float(values.pop("click"))
                values.pop("id")
                yield label, [f"{k}={v}" for k, v in values.items()]
            else:
                label, *features = line.split()
                yield (1.0 if label == "1" else 0.0), [feature.split(":")[0] for feature in features]


def hashed(files: Files, name: str) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], int]:
    """Per file, the labels and each row's token ids, padded to the longest row with a padding id. The ids are
    the tokens' hashes into ``BUCKETS``, renumbered densely over the buckets the files use: the same model as a
    table of ``BUCKETS`` weights (the same collisions), small enough for dense steps."""
    labelled = [list(rows(path, name)) for path in (files.train, files.valid, files.test)]
    buckets = [[[zlib.crc32(token.encode()) % BUCKETS for token in tokens] for _, tokens in data] for data in labelled]
    used = sorted({bucket for bags in buckets for bag in bags for bucket in bag})
    dense = {bucket: index for index, bucket in enumerate(used)}
    width = max(len(bag) for bags in buckets for bag in bags)
    splits = [
        (
            torch.tensor([label for label, _ in data]),
            torch.tensor([[dense[b] for b in bag] + [len(used)] * (width - len(bag)) for bag in bags]),
        )
        for data, bags in zip(labelled, buckets)
    ]
    return splits, len(used)


class HashedLogisticRegression(nn.Module):
    """A weight per hashed token, summed over a row's tokens, plus a bias; the last row pads."""

    def __init__(self, num_ids: int) -> None:
        super().__init__()
        self.weights = nn.EmbeddingBag(num_ids + 1, 1, mode="sum", padding_idx=num_ids)
        nn.init.zeros_(self.weights.weight)
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weights(ids).squeeze(1) + self.bias


def logistic_regression_test_auc(files: Files, name: str, seed: int) -> float:
    """The baseline: the best validation epoch and learning rate, scored on the test file. Adagrad's dense step
    leaves a weight without gradient as it is, so it equals the sparse step over the hashed table."""
    torch.set_num_threads(1)  # A model this small steps 7x slower on two threads of a busy 2-core machine.
    (train, valid, test), num_ids = hashed(files, name)
    best_valid, best_test = -1.0, 0.0
    for lr in (0.01, 0.03, 0.1):
        torch.manual_seed(seed)
        model = HashedLogisticRegression(num_ids)
        optimizer = torch.optim.Adagrad(model.parameters(), lr=lr)
        generator = torch.Generator().manual_seed(seed)
        for _ in range(20):
            for batch in torch.randperm(len(train[0]), generator=generator).split(256):
                loss = nn.functional.binary_cross_entropy_with_logits(model(train[1][batch]), train[0][batch])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            with torch.no_grad():
                valid_auc = float(binary_auroc(model(valid[1]), valid[0].long()))
                if valid_auc > best_valid:
                    best_valid, best_test = valid_auc, float(binary_auroc(model(test[1]), test[0].long()))
    return best_test


def spread(values: list[float], spec: str = ".4f") -> str:
    """``mean±std`` of ``values`` (the std of the seeds; 0 for one seed)."""
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):{spec}}±{std:.4f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=list(FORMAT_OF_PRESET))
    parser.add_argument("--train")
    parser.add_argument("--valid")
    parser.add_argument("--test")
    parser.add_argument("--generated", metavar="OUT_DIR", help="write public-format samples there, one per seed")
    parser.add_argument("--rows", type=int, nargs=3, help="rows of train, valid, test; default: the real samples'")
    parser.add_argument("--formats", nargs="+", choices=list(PRESET_OF_FORMAT), default=list(PRESET_OF_FORMAT))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides for every train command")
    args = parser.parse_args()
    if args.generated is None and None in (args.preset, args.train, args.valid, args.test):
        parser.error("give --preset, --train, --valid and --test, or --generated OUT_DIR")

    work_dir = tempfile.mkdtemp(prefix="preset-quality-")
    presets = [PRESET_OF_FORMAT[name] for name in args.formats] if args.generated else [args.preset]
    for preset in presets:
        name = FORMAT_OF_PRESET[preset]
        preset_aucs, lr_aucs = [], []
        for seed in args.seeds:
            if args.generated:
                paths = write_samples(os.path.join(args.generated, f"seed{seed}"), name, args.rows, seed)
                files = Files(paths["train"], paths["valid"], paths["test"])
            else:
                files = Files(args.train, args.valid, args.test)
            preset_aucs.append(preset_test_auc(preset, files, seed, work_dir, args.overrides))
            lr_aucs.append(logistic_regression_test_auc(files, name, seed))
            print(f"{preset} seed={seed} preset_auc={preset_aucs[-1]:.4f} lr_auc={lr_aucs[-1]:.4f}", flush=True)
        gaps = [p - b for p, b in zip(preset_aucs, lr_aucs)]
        print(f"{preset}: preset_auc={spread(preset_aucs)} lr_auc={spread(lr_aucs)} gap={spread(gaps, '+.4f')}")


if __name__ == "__main__":
    main()
