"""``export`` of ``dlrm_criteo_tiny``: the folder's size and the export's time, and the README's plain-torch scorer's
rows/s against ``predict``'s on the validation split.

A run is trained briefly (the tables are full-sized whatever the steps), then exported ``--repetitions`` times
(each a fresh ``python -m recipes export``, as a user runs it: start-up, model build, trace and table writes
included); ``predict`` is timed the same way, as a command, and in-process over the same rows as the scorer (the
model's forward alone), so that neither side's rows/s pays for the other's start-up. Medians are reported.

    python benchmarks/export.py [--steps 20] [--repetitions 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from recipes.cli.job_spec import JobSpec
from recipes.cli.scoring import loaded_checkpoint
from support.serving_scorer import readme_scorer, split_rows


def recipes(cwd: Path, *args: str) -> float:
    """Run ``python -m recipes ARGS``; its seconds."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "recipes", *args], cwd=cwd, check=True, capture_output=True)
    return time.perf_counter() - start


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repetitions", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("WANDB_MODE", "offline")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        steps = f"trainer.max_num_steps={args.steps}"
        recipes(root, "train", "dlrm_criteo_tiny", "-o", "out", steps, "metrics.recorders.console=false")
        export_s = [recipes(root, "export", "out", "-o", f"export_{i}") for i in range(args.repetitions)]
        predict_s = [recipes(root, "predict", "out", "-o", f"p_{i}.csv") for i in range(args.repetitions)]

        scorer = readme_scorer()
        rows = split_rows(root / "out")
        num_rows = sum(len(dense) for dense, _ in rows)
        model = scorer.load(root / "export_0")
        plain_s, forward_s = [], []
        with loaded_checkpoint(JobSpec(str(root / "out/config.yaml"), str(root / "out")), "last", "valid", True) as ck:
            validation = next(iter(ck.validations.values()))
            batches = [batch for step in validation.reader for batch in step]
            for _ in range(args.repetitions):
                start = time.perf_counter()
                for dense, features in rows:
                    scorer.score(model, dense, features)
                plain_s.append(time.perf_counter() - start)
                start = time.perf_counter()
                with torch.no_grad():
                    for batch in batches:
                        torch.sigmoid(ck.built.parts.train_unit.model(batch))
                forward_s.append(time.perf_counter() - start)

        size = folder_bytes(root / "export_0")
        tables = folder_bytes(root / "export_0/tables")
        print(f"dlrm_criteo_tiny, {args.steps} steps, {num_rows:,} validation rows, medians of {args.repetitions}")
        print(f"export size:       {size / 1e6:.2f} MB ({tables / 1e6:.2f} MB tables, rest program + JSON)")
        print(f"export time:       {statistics.median(export_s):.2f} s (the command, start-up included)")
        print(f"predict time:      {statistics.median(predict_s):.2f} s (the command, start-up included)")
        plain, forward = statistics.median(plain_s), statistics.median(forward_s)
        print(f"plain scorer:      {num_rows / plain:,.0f} rows/s (README scorer over the export)")
        print(f"model forward:     {num_rows / forward:,.0f} rows/s (predict's model in-process, same rows)")
        print(f"predict command:   {num_rows / statistics.median(predict_s):,.0f} rows/s (start-up included)")


if __name__ == "__main__":
    main()
