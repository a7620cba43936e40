"""``export`` of a preset's run (``dlrm_criteo_tiny`` by default): the folder's size and the export's time, the
tables' bytes in float32, int8 and int4 (``--dtype``) with their ratios, the AUC of each export scored by the serving
tutorial's plain-torch scorer against ``predict``'s, and that scorer's rows/s against ``predict``'s on the validation
split.

A run is trained (the tables are full-sized whatever the steps; the AUCs need a model that learned), then exported
``--repetitions`` times (each a fresh ``python -m recipes export``, as a user runs it: start-up, model build, trace
and table writes included) and once with ``--dtype int8`` and ``int4``; ``predict`` is timed the same way, as a
command, and in-process over the same rows as the scorer (the model's forward alone), so that neither side's rows/s
pays for the other's start-up. Medians are reported.

    python benchmarks/export.py [--preset dlrm_criteo_tiny] [--steps 300] [--repetitions 3]
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

import numpy as np
import pyarrow.csv as pa_csv
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from recipes.cli.job_spec import JobSpec
from recipes.cli.scoring import loaded_checkpoint
from support.serving_scorer import scores, split_rows, tutorial_scorer
from units import BinaryAUC

DTYPES = ("int8", "int4")


def recipes(cwd: Path, *args: str) -> float:
    """Run ``python -m recipes ARGS``; its seconds."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "recipes", *args], cwd=cwd, check=True, capture_output=True)
    return time.perf_counter() - start


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    metric = BinaryAUC()
    metric.update(torch.tensor(scores, dtype=torch.float32), torch.tensor(labels, dtype=torch.int64))
    return float(metric.compute())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="dlrm_criteo_tiny")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repetitions", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("WANDB_MODE", "offline")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        steps = f"trainer.max_num_steps={args.steps}"
        epochs = "trainer.max_num_data_epochs=null"
        recipes(root, "train", args.preset, "-o", "out", steps, epochs, "metrics.recorders.console=false")
        export_s = [recipes(root, "export", "out", "-o", f"export_{i}") for i in range(args.repetitions)]
        quantised_s = {dtype: recipes(root, "export", "out", "-o", dtype, "--dtype", dtype) for dtype in DTYPES}
        predict_s = [recipes(root, "predict", "out", "-o", f"p_{i}.csv") for i in range(args.repetitions)]

        scorer = tutorial_scorer()
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

        predicted = pa_csv.read_csv(root / "p_0.csv")
        labels = predicted.column("label").to_numpy()
        aucs = {dtype: auc(scores(scorer, scorer.load(root / dtype), rows), labels) for dtype in DTYPES}
        aucs["float32"] = auc(scores(scorer, model, rows), labels)
        predict_auc = auc(predicted.column("score").to_numpy(), labels)

        size = folder_bytes(root / "export_0")
        tables = {"float32": folder_bytes(root / "export_0/tables")}
        tables |= {dtype: folder_bytes(root / dtype / "tables") for dtype in DTYPES}
        print(f"{args.preset}, {args.steps} steps, {num_rows:,} validation rows, medians of {args.repetitions}")
        print(f"export size:       {size / 1e6:.2f} MB ({tables['float32'] / 1e6:.2f} MB tables, rest program + JSON)")
        for dtype in ("float32", *DTYPES):
            ratio = tables["float32"] / tables[dtype]
            print(
                f"tables {dtype:<8}   {tables[dtype]:,} bytes on disk, {ratio:.2f}x fewer than float32; "
                f"AUC {aucs[dtype]:.5f} (predict {predict_auc:.5f}, {aucs[dtype] - predict_auc:+.5f})"
            )
        print(f"export time:       {statistics.median(export_s):.2f} s (the command, start-up included)")
        print("quantised export:  " + ", ".join(f"{dtype} {seconds:.2f} s" for dtype, seconds in quantised_s.items()))
        print(f"predict time:      {statistics.median(predict_s):.2f} s (the command, start-up included)")
        plain, forward = statistics.median(plain_s), statistics.median(forward_s)
        print(f"plain scorer:      {num_rows / plain:,.0f} rows/s (the tutorial scorer over the float32 export)")
        print(f"model forward:     {num_rows / forward:,.0f} rows/s (predict's model in-process, same rows)")
        print(f"predict command:   {num_rows / statistics.median(predict_s):,.0f} rows/s (start-up included)")


if __name__ == "__main__":
    main()
