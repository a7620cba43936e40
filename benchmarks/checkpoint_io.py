"""Checkpoint I/O: ``CheckpointManager`` against plain ``torch.save``/``torch.load`` of the same state.

Both write to the same temporary directory; the repetitions are interleaved so that drift in
the machine's state (page cache, other load) hits both alike, and medians are reported. The
async row measures how long ``save(blocking=False)`` keeps the caller, against a blocking save.
The sha256 row times hashing the plain file once, from the page cache: the manager checksums
every byte it writes and reads, so that time bounds how close it can come to the baseline.

    python benchmarks/checkpoint_io.py [--size-mb 256] [--repetitions 5]
"""

from __future__ import annotations

import argparse
import hashlib
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from checkpoint import CheckpointManager, CheckpointPolicy
from gang import FakeGang


def make_state(size_mb: int) -> dict[str, object]:
    """A model and Adam-like optimizer state of about ``size_mb`` MB, in 16 MB tensors."""
    floats_per_tensor = 4 * 1024 * 1024
    num_tensors = max(1, size_mb // 16 // 3)
    model = {f"layer{i}.weight": torch.randn(floats_per_tensor) for i in range(num_tensors)}
    optimizer = {
        i: {"step": torch.tensor(10.0), "exp_avg": torch.randn_like(w), "exp_avg_sq": torch.rand_like(w)}
        for i, w in enumerate(model.values())
    }
    return {"model": model, "optimizer": {"state": optimizer, "param_groups": [{"lr": 1e-3}]}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=256)
    parser.add_argument("--repetitions", type=int, default=5)
    args = parser.parse_args()

    state = make_state(args.size_mb)
    size_mb = sum(t.numel() * t.element_size() for t in _tensors(state)) / 1e6
    names = ("torch.save", "save", "torch.load", "load", "async", "sha256")
    times: dict[str, list[float]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as directory:
        manager = CheckpointManager(f"{directory}/checkpoints", FakeGang(), CheckpointPolicy(keep_last_n=1))
        for repetition in range(args.repetitions):
            # Like the manager (keep_last_n=1), the baseline writes a new file and then drops the old one.
            plain_path = Path(directory) / f"plain_{repetition}.pt"
            times["torch.save"].append(_timed(_save_and_drop_previous, state, plain_path, repetition))
            sync_step, async_step = 2 * repetition + 1, 2 * repetition + 2
            times["save"].append(_timed(manager.save, sync_step, state))
            times["torch.load"].append(_timed(torch.load, plain_path, map_location="cpu", weights_only=True))
            times["load"].append(_timed(manager.load, sync_step))
            times["sha256"].append(_timed(_sha256_of_file, plain_path))
            times["async"].append(_timed(manager.save, async_step, state, blocking=False))
            manager.wait()

    median = {name: statistics.median(values) for name, values in times.items()}
    print(f"command: {shlex.join([Path(sys.executable).name, *sys.argv])}")
    print(f"state: {size_mb:.0f} MB in {len(_tensors(state))} tensors; medians of {args.repetitions} repetitions\n")
    print("| operation | median s | MB/s | throughput vs baseline |")
    print("| --- | ---: | ---: | ---: |")
    _row("torch.save", median["torch.save"], size_mb, median["torch.save"])
    _row("CheckpointManager.save", median["save"], size_mb, median["torch.save"])
    _row("torch.load", median["torch.load"], size_mb, median["torch.load"])
    _row("CheckpointManager.load", median["load"], size_mb, median["torch.load"])
    blocked = median["async"] / median["save"]
    print(f"| async save, caller blocked | {median['async']:.3f} | - | {blocked:.3f} of a sync save's time |")
    print(f"| sha256 of the file (reference) | {median['sha256']:.3f} | {size_mb / median['sha256']:.0f} | - |")


def _save_and_drop_previous(state: object, path: Path, repetition: int) -> None:
    torch.save(state, path)
    path.with_name(f"plain_{repetition - 1}.pt").unlink(missing_ok=True)


def _sha256_of_file(path: Path) -> str:
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def _timed(action: Callable[..., object], *args: object, **kwargs: object) -> float:
    start = time.perf_counter()
    action(*args, **kwargs)
    return time.perf_counter() - start


def _row(label: str, seconds: float, size_mb: float, baseline_seconds: float) -> None:
    ratio = baseline_seconds / seconds  # Throughput ratio: above 1 is faster than the baseline.
    print(f"| {label} | {seconds:.3f} | {size_mb / seconds:.0f} | {ratio:.2f} |")


def _tensors(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _tensors(item)]
    if isinstance(value, list | tuple):
        return [t for item in value for t in _tensors(item)]
    return []


if __name__ == "__main__":
    main()
