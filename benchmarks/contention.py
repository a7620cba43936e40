"""Training on a shared machine: steps/s with busy processes spinning beside the run, against none.

Each run is ``python -m recipes train PRESET`` for ``--steps`` steps, its rate read from its own
``throughput`` metric (targets/s per publishing window, the first window, start-up and numba's
compilation, left out) and divided by the batch. Beside it, ``N`` processes spin on a core each
(``while True: pass``): none, ``cores - 1`` (one core left to the run) and ``cores`` (every core
taken). Each preset runs at the default threads per rank (what the run chooses) and at
``gang.threads_per_rank=1``; the conditions take turns within each round and medians over rounds
are reported.

``slowdown_<preset>`` is the rate without busy processes over the rate with ``cores - 1`` of them,
at the default threads: with one of two cores taken, at most the 2x the lost core explains (and a
little more for sharing it). ``default_vs_1_thread_<preset>`` is the default threads' rate over one
thread's, with ``cores - 1`` busy processes: the default must not be slower (>= 0.9).

    python benchmarks/contention.py [--presets dlrm_criteo_tiny dlrm_criteo_tiny_dynamic] [--steps 150] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

SHORT_NAMES = {"dlrm_criteo_tiny": "fixed", "dlrm_criteo_tiny_dynamic": "hash"}


@contextlib.contextmanager
def busy(num_processes: int) -> Iterator[None]:
    """``num_processes`` processes spinning on a core each while the block runs."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(num_processes)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def steps_per_second(preset: str, steps: int, threads: int | None, output_dir: Path) -> tuple[float, str]:
    """The run's median steps/s after its first publishing window, and its start-up line about threads."""
    command = [sys.executable, "-m", "recipes", "train", preset, "-o", str(output_dir)]
    command += [
        f"trainer.max_num_steps={steps}",
        "trainer.validate_every_n_steps=null",
        "trainer.publish_metrics_every_n_steps=25",
        "checkpoint.every_n_steps=null",
        "metrics.recorders.console=false",
        "metrics.recorders.tensorboard=false",
    ]
    if threads is not None:
        command.append(f"gang.threads_per_rank={threads}")
    run = subprocess.run(command, capture_output=True, text=True, check=False)
    if run.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{run.stderr[-3000:]}")
    threads_line = next((line for line in run.stdout.splitlines() if line.startswith("threads:")), "")
    config = yaml.safe_load((output_dir / "config.yaml").read_text())
    batch_size = int(next(value for value in _values(config, "batch_size") if value is not None))  # dataset's
    lines = (output_dir / "metrics" / "train.jsonl").read_text().splitlines()
    rates = [float(json.loads(line)["throughput"]) for line in lines[1:]]
    return float(statistics.median(rates)) / batch_size, threads_line


def _values(node: Any, key: str) -> Iterator[Any]:
    """Every value of ``key`` in a nested mapping, depth first."""
    if isinstance(node, dict):
        for name, value in node.items():
            if name == key:
                yield value
            yield from _values(value, key)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=list(SHORT_NAMES))
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    loads = [0, cores - 1, cores]
    print(f"{cores} cores; busy processes beside each run: {loads}; {args.steps} steps; {args.rounds} rounds")
    results = []
    with tempfile.TemporaryDirectory() as folder:
        for preset in args.presets:
            rates: dict[tuple[int, int | None], list[float]] = {(load, t): [] for load in loads for t in (None, 1)}
            chosen: dict[int, str] = {}
            for round_nr in range(args.rounds):
                for load in loads:
                    for threads in (None, 1):
                        output_dir = Path(folder) / f"{preset}_{load}_{threads}_{round_nr}"
                        with busy(load):
                            rate, line = steps_per_second(preset, args.steps, threads, output_dir)
                        rates[(load, threads)].append(rate)
                        if threads is None:
                            chosen[load] = line
            median = {key: statistics.median(values) for key, values in rates.items()}
            print(f"\n{preset}")
            print("| busy processes | threads per rank | median steps/s | rounds | start-up line (default) |")
            print("| ---: | --- | ---: | --- | --- |")
            for (load, threads), values in rates.items():
                line = chosen[load] if threads is None else ""
                label = "default" if threads is None else str(threads)
                rounds = ", ".join(f"{v:.1f}" for v in values)
                print(f"| {load} | {label} | {median[(load, threads)]:.1f} | {rounds} | {line} |")
            short = SHORT_NAMES.get(preset, preset)
            slowdown = median[(0, None)] / median[(cores - 1, None)]
            versus_one = median[(cores - 1, None)] / median[(cores - 1, 1)]
            results.append(f"slowdown_{short}={slowdown:.2f} default_vs_1_thread_{short}={versus_one:.2f}")
    print("\n" + " ".join(results))


if __name__ == "__main__":
    main()
