"""Steps/s of a built-in recipe with freed host memory kept for the next step, against glibc's malloc as it is.

Each run is ``python -m recipes train PRESET --nproc N`` with ``trainer.keep_freed_memory`` true or false
(``recipes.runtime.host_memory``), in alternating rounds; the rate is read as ``dp_scaling.py`` reads it (the run's
throughput metric, first window skipped). The last line reads ``ratio=X`` (kept / as is, medians).

    python benchmarks/freed_memory.py [--preset dlrm_criteo_tiny] [--nproc 1] [--batch-size 8192] [--steps 60]
        [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from dp_scaling import steps_per_second  # benchmarks/dp_scaling.py


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="dlrm_criteo_tiny")
    parser.add_argument("--nproc", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    print(f"{args.preset}, {args.nproc} process(es), global batch {args.batch_size}, {args.steps} steps")
    rates: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as folder:
        for round_index in range(args.rounds):
            for keep in (False, True):
                output_dir = Path(folder) / f"{keep}_{round_index}"
                override = f"trainer.keep_freed_memory={str(keep).lower()}"
                rates[keep].append(
                    steps_per_second(args.preset, args.nproc, args.steps, args.batch_size, output_dir, [override])
                )
    print("| trainer.keep_freed_memory | median steps/s | rounds |")
    print("| --- | ---: | --- |")
    for keep in (False, True):
        rounds = ", ".join(f"{rate:.2f}" for rate in rates[keep])
        print(f"| {str(keep).lower()} | {statistics.median(rates[keep]):.2f} | {rounds} |")
    print(f"ratio={statistics.median(rates[True]) / statistics.median(rates[False]):.2f}")


if __name__ == "__main__":
    main()
