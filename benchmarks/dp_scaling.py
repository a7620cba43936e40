"""Steps/s of a built-in recipe on 1 and 2 data-parallel processes of this machine.

Each run is ``python -m recipes train PRESET --nproc N`` with the same global batch (split over
the ranks), so both do the same work per step. The rate is read from the run's own
``throughput`` metric (targets/s over each publishing window, reduced over ranks), skipping the
first window (start-up, numba compilation), and divided by the global batch. Runs of 1 and 2
processes alternate; medians over rounds are reported.

    python benchmarks/dp_scaling.py [--preset dlrm_criteo_tiny] [--steps 100] [--batch-sizes 8192 512] [--rounds 3]
        [--override KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def steps_per_second(
    preset: str, nproc: int, steps: int, batch_size: int, output_dir: Path, overrides: list[str]
) -> float:
    command = [sys.executable, "-m", "recipes", "train", preset, "-o", str(output_dir), "--nproc", str(nproc)]
    command += [
        f"trainer.max_num_steps={steps}",
        "trainer.validate_every_n_steps=null",
        "trainer.publish_metrics_every_n_steps=20",
        f"dataset.batch_size={batch_size}",
        "checkpoint.every_n_steps=null",
        "metrics.recorders.console=false",
        "metrics.recorders.tensorboard=false",
        *overrides,
    ]
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{run.stderr[-3000:]}")
    lines = (output_dir / "metrics" / "train.jsonl").read_text().splitlines()
    rates = [float(json.loads(line)["throughput"]) for line in lines[1:]]
    return float(statistics.median(rates)) / batch_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="dlrm_criteo_tiny")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[8192, 512], help="global batches")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--override", nargs="*", default=[], help="config overrides of both runs, KEY=VALUE")
    args = parser.parse_args()

    print(f"{args.preset}, {args.steps} steps, {os.cpu_count()} CPU cores; each rank takes its share of them")
    ratios = {}
    with tempfile.TemporaryDirectory() as folder:
        for batch_size in args.batch_sizes:
            rates: dict[int, list[float]] = {1: [], 2: []}
            for round_nr in range(args.rounds):
                for nproc in (1, 2):
                    output_dir = Path(folder) / f"run_{batch_size}_{nproc}_{round_nr}"
                    rates[nproc].append(
                        steps_per_second(args.preset, nproc, args.steps, batch_size, output_dir, args.override)
                    )
            one, two = statistics.median(rates[1]), statistics.median(rates[2])
            ratios[batch_size] = two / one
            print(f"\nglobal batch {batch_size}")
            print("| processes | median steps/s | rounds |")
            print("| ---: | ---: | --- |")
            for nproc, median in ((1, one), (2, two)):
                print(f"| {nproc} | {median:.1f} | {', '.join(f'{r:.1f}' for r in rates[nproc])} |")
            print(f"2 processes / 1 process: {two / one:.2f}x")
    print(" ".join(f"ratio_{batch_size}={ratio:.2f}" for batch_size, ratio in ratios.items()))


if __name__ == "__main__":
    main()
