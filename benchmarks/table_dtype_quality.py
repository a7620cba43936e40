"""Do half-precision tables keep the quality? AUC with float16 and bfloat16 rows beside float32, same seeds.

Issue 51's quality line: tables stored in float16 or bfloat16 (``model.embeddings.dtype``, the fused update
rounding stochastically) within 0.001 AUC of float32. Each dataset trains its preset once per seed and dtype,
nothing else changed, as a user would run it:

- ``movielens``: ``movielens_small`` on the shipped ml-latest-small, the AUC of its last validation (as
  ``movielens_quality.py``);
- ``criteo``, ``avazu``, ``frappe``: the public-format presets on samples written by ``public_format_samples.py``
  (one draw per seed, 8,000 / 1,000 / 1,000 rows), then ``eval --split test`` (as ``preset_quality.py``).

The gap of a dtype is its AUC minus float32's on the same seed (the same data, the same initial rows up to their
rounding); the figures are the mean gap over seeds and the largest in size. ``--overrides`` go to every run, float32's
too: ``trainer.device=cuda`` trains on a GPU (``benchmarks/gpu_checks.sh``), ``model.embeddings.kind=hash`` on hash
tables.

    python benchmarks/table_dtype_quality.py [--datasets movielens criteo avazu frappe] [--seeds 0 1 2]
        [--dtypes float16 bfloat16] [--overrides KEY=VALUE ...]

The last line reads ``max_abs_gap=G`` (goal: under 0.001), over every dataset, dtype and seed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from movielens_quality import final_auc, train_command
from preset_quality import PRESET_OF_FORMAT, Files, preset_test_auc
from public_format_samples import write_samples

DATASETS = ("movielens", *PRESET_OF_FORMAT)
SAMPLE_ROWS = [8000, 1000, 1000]


def dtype_override(dtype: str) -> list[str]:
    return [f"model.embeddings.dtype={dtype}"]


def auc(dataset: str, dtype: str, seed: int, work_dir: str, overrides: list[str]) -> float:
    """One run's AUC: ``dataset``'s preset with tables in ``dtype``, seed ``seed``, and ``overrides``."""
    run_dir = os.path.join(work_dir, dtype)
    os.makedirs(run_dir, exist_ok=True)
    if dataset == "movielens":
        output_dir = os.path.join(run_dir, f"movielens_seed{seed}")
        run_overrides = [*dtype_override(dtype), *overrides, "metrics.recorders.console=false"]
        command = train_command(run_overrides, seed, output_dir)
        run = subprocess.run(command, capture_output=True, text=True)
        if run.returncode:
            raise SystemExit(f"movielens {dtype} seed {seed} failed: {run.stderr.strip()[-2000:]}")
        return final_auc(output_dir)
    paths = write_samples(os.path.join(work_dir, "samples", f"seed{seed}"), dataset, SAMPLE_ROWS, seed)
    files = Files(paths["train"], paths["valid"], paths["test"])
    return preset_test_auc(PRESET_OF_FORMAT[dataset], files, seed, run_dir, [*dtype_override(dtype), *overrides])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", nargs="+", choices=DATASETS, default=list(DATASETS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--dtypes", nargs="+", choices=["float16", "bfloat16"], default=["float16", "bfloat16"])
    parser.add_argument("--overrides", nargs="+", default=[], help="config overrides of every run (KEY=VALUE)")
    args = parser.parse_args()
    gaps: list[float] = []
    with tempfile.TemporaryDirectory(prefix="table-dtype-quality-") as work_dir:
        for dataset in args.datasets:
            aucs: dict[str, list[float]] = {}
            for seed in args.seeds:
                for dtype in ("float32", *args.dtypes):
                    value = auc(dataset, dtype, seed, os.path.join(work_dir, dataset), args.overrides)
                    aucs.setdefault(dtype, []).append(value)
                    print(f"{dataset} seed={seed} {dtype}: auc={aucs[dtype][-1]:.4f}", file=sys.stderr, flush=True)
            base = aucs["float32"]
            spread = statistics.stdev(base) if len(base) > 1 else 0.0
            print(f"{dataset} float32: auc={statistics.mean(base):.4f} ± {spread:.4f}")
            for dtype in args.dtypes:
                gap = [value - reference for value, reference in zip(aucs[dtype], base)]
                gaps.extend(gap)
                print(
                    f"{dataset} {dtype}: auc={statistics.mean(aucs[dtype]):.4f} mean_gap={statistics.mean(gap):+.4f} "
                    f"largest_gap={max(gap, key=abs):+.4f} (per seed: {', '.join(f'{g:+.4f}' for g in gap)})"
                )
    print(f"max_abs_gap={max(abs(gap) for gap in gaps):.4f}")


if __name__ == "__main__":
    main()
