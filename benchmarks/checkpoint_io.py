"""Checkpoint I/O: ``CheckpointManager`` against plain ``torch.save``/``torch.load`` of the same state.

The state is that of a real model: a stack of 2048 x 2048 linear layers and its Adam state.
Both sides write to the same temporary directory, taking turns within each repetition; a
ratio is taken per repetition, between neighbours in time, and the median ratio is reported
(this shared machine drifts by tens of percent from one second to the next). The page cache
is flushed (``os.sync``) before each timed write, so that no write pays for the previous
one's writeback.

The async rows come from a training loop: an asynchronous save, then the next training step
(forward, backward, optimizer step). The loop is blocked while ``save(blocking=False)`` runs
and while it waits in ``wait_until_staged`` before the optimizer step (the Trainer does the
same); that total is set against a blocking save. The step itself runs slower while the save
is written beside it, since they share the cores: that is reported too.

Then, with ``--deltas`` (or alone with ``--deltas-only``), the checkpoints that follow the rows touched
(``checkpoint.full_every``, issue 48): one table of ``--rows`` rows (default 10,000,000) of dim 32 (the
issue's tiered-table dim; ``sparse_step.py`` uses 64) with row-wise Adagrad, shared by 26 features and
trained through the collection and its sparse optimizer on a fresh batch of 4096 x 26 Zipf(1.1) ids at every
step (numpy ``zipf(1.1)`` modulo the rows, as in ``sparse_step.py``). It is saved whole at step 0; after 10,
100 and ``--steps`` (1,000) steps a delta over that save (the rows changed since) and a full save of the same
table are written by ``CheckpointManager`` in turn, ``--delta-repetitions`` times each at the last point (the
page cache flushed before each); their median times, their bytes on disk, and the delta's share of the
full save's bytes, ``delta_fraction=`` (the last line), are printed. The last delta, put over its base
(``recipes.checkpointing.deltas``), is checked to equal the live table bit for bit.

    python benchmarks/checkpoint_io.py [--size-mb 256] [--repetitions 15] [--batch-size 64]
    python benchmarks/checkpoint_io.py --deltas-only [--rows 10000000] [--steps 1000] [--delta-repetitions 3]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from checkpoint import CheckpointManager, CheckpointPolicy
from embedding import (
    EmbeddingTableConfig,
    JaggedIds,
    RowwiseAdagradConfig,
    ShardedEmbeddingCollection,
    SparseFeatures,
    SparseOptimizer,
)
from gang import FakeGang
from recipes.checkpointing.deltas import rank_state

WIDTH = 2048
DELTA_DIM = 32
BATCH = 4096
FEATURES = [f"f{i}" for i in range(26)]


class Training:
    """A model of ``size_mb`` MB of parameters and Adam state, and one training step of it."""

    def __init__(self, size_mb: int, batch_size: int) -> None:
        layer_mb = WIDTH * WIDTH * 4 / 1e6
        num_layers = max(1, round(size_mb / (3 * layer_mb)))
        self.model = nn.Sequential(*(nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(num_layers)))
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        self.inputs = torch.randn(batch_size, WIDTH)
        self.forward_backward()
        self.optimizer.step()  # Creates the Adam state.
        self.optimizer.zero_grad()
        changed_by_step = {p.untyped_storage().data_ptr() for p in self.model.parameters()} | {
            value.untyped_storage().data_ptr() for state in self.optimizer.state.values() for value in state.values()
        }
        self.unchanged_until_staged = lambda tensor: tensor.untyped_storage().data_ptr() in changed_by_step

    def state(self) -> dict[str, object]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def forward_backward(self) -> None:
        self.model(self.inputs).square().mean().backward()

    def update(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=256)
    parser.add_argument("--repetitions", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--deltas", action="store_true", help="also measure delta checkpoints of a sparse table")
    parser.add_argument("--deltas-only", action="store_true", help="measure delta checkpoints only")
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--delta-repetitions", type=int, default=3)
    args = parser.parse_args()
    print(f"command: {shlex.join([Path(sys.executable).name, *sys.argv])}")
    if not args.deltas_only:
        dense_checkpoints(args)
    if args.deltas or args.deltas_only:
        delta_checkpoints(args.rows, args.steps, args.delta_repetitions)


def dense_checkpoints(args: argparse.Namespace) -> None:
    """The manager against plain ``torch.save``/``torch.load``, and asynchronous saves, on a dense model's state."""

    training = Training(args.size_mb, args.batch_size)
    state = training.state()
    size_mb = sum(t.numel() * t.element_size() for t in _tensors(state)) / 1e6
    names = ("torch.save", "save", "torch.load", "load", "sha256", "async blocked", "step", "step beside save")
    times: dict[str, list[float]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as directory:
        manager = CheckpointManager(f"{directory}/checkpoints", FakeGang(), CheckpointPolicy(keep_last_n=1))
        for repetition in range(args.repetitions):
            # Like the manager (keep_last_n=1), the baseline writes a new file and then drops the old one.
            plain_path = Path(directory) / f"plain_{repetition}.pt"
            times["torch.save"].append(_timed_write(_save_and_drop_previous, state, plain_path, repetition))
            sync_step, async_step = 2 * repetition + 1, 2 * repetition + 2
            times["save"].append(_timed_write(manager.save, sync_step, state))
            times["torch.load"].append(_timed(torch.load, plain_path, map_location="cpu", weights_only=True))
            times["load"].append(_timed(manager.load, sync_step))
            times["sha256"].append(_timed(_sha256_of_file, plain_path))
            times["step"].append(_timed(_train_step, training, manager))
            os.sync()
            blocked, step = _async_save_and_step(manager, training, async_step)
            times["async blocked"].append(blocked)
            times["step beside save"].append(step)
            manager.wait()

    median = {name: statistics.median(values) for name, values in times.items()}
    print(f"state: {size_mb:.0f} MB in {len(_tensors(state))} tensors; {args.repetitions} repetitions\n")
    print("| operation | median s | MB/s | median ratio per repetition |")
    print("| --- | ---: | ---: | --- |")
    _row("torch.save", median["torch.save"], size_mb)
    save = _median_ratio(times["torch.save"], times["save"])
    _row("CheckpointManager.save", median["save"], size_mb, f"{save:.2f} of torch.save's throughput")
    _row("torch.load", median["torch.load"], size_mb)
    load = _median_ratio(times["torch.load"], times["load"])
    _row("CheckpointManager.load", median["load"], size_mb, f"{load:.2f} of torch.load's throughput")
    _row("sha256 of the plain file (reference)", median["sha256"], size_mb)
    blocked = _median_ratio(times["async blocked"], times["save"])
    _row("async save: training loop blocked", median["async blocked"], None, f"{blocked:.4f} of a sync save's time")
    _row(f"training step (batch {args.batch_size})", median["step"], None)
    slowdown = _median_ratio(times["step beside save"], times["step"])
    _row("training step beside an async save", median["step beside save"], None, f"{slowdown:.2f}x the step")


def delta_checkpoints(num_rows: int, num_steps: int, repetitions: int) -> None:
    """A sparse table's delta checkpoints after 10, 100 and ``num_steps`` steps against full saves of it."""
    collection = ShardedEmbeddingCollection([EmbeddingTableConfig("shared", num_rows, DELTA_DIM, tuple(FEATURES))])
    optimizer = SparseOptimizer(collection, RowwiseAdagradConfig(lr=0.05))
    rng = np.random.default_rng(0)
    upstream = [torch.randn(BATCH, DELTA_DIM, generator=torch.Generator().manual_seed(1)) for _ in FEATURES]
    points = sorted({min(10, num_steps), min(100, num_steps), num_steps})
    print(f"\nsparse table: {num_rows:,} rows x dim {DELTA_DIM}, rowwise_adagrad; batch {BATCH} x {len(FEATURES)} ids")
    print(
        "| steps | rows changed | delta s | delta MB | full save s | full MB | delta bytes / full | delta time / full |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as directory:
        deltas = CheckpointManager(f"{directory}/deltas", FakeGang(), CheckpointPolicy(keep_last_n=1))
        fulls = CheckpointManager(f"{directory}/full", FakeGang(), CheckpointPolicy(keep_last_n=1))
        deltas.save(0, {}, {"sharded": {"embeddings": collection.sharded_state_dict()}})
        collection.forget_changes()
        train_s, done, fraction = 0.0, 0, 0.0
        for point in points:
            start = time.perf_counter()
            for _ in range(point - done):
                _sparse_step(collection, optimizer, rng, upstream)
            train_s += time.perf_counter() - start
            done = point
            times: dict[str, list[float]] = {"delta": [], "full": []}
            for repetition in range(repetitions if point == num_steps else 1):
                step = point * 10 + repetition  # a new step per save; the table does not change between them
                times["delta"].append(_timed_write(_save_delta, deltas, collection, step))
                times["full"].append(_timed_write(_save_full, fulls, collection, step))
            delta_bytes, full_bytes = _bytes_of(deltas, step), _bytes_of(fulls, step)
            fraction = delta_bytes / full_bytes
            changed = int(collection.changed_rows[0].sum())  # above WHOLE_ABOVE of the rows, the delta is whole
            ratio = _median_ratio(times["delta"], times["full"])
            print(
                f"| {point:,} | {changed:,} ({changed / num_rows:.3f}) | {statistics.median(times['delta']):.3f} | "
                f"{delta_bytes / 1e6:.1f} | {statistics.median(times['full']):.3f} | {full_bytes / 1e6:.1f} | "
                f"{fraction:.4f} | {ratio:.3f} |"
            )
        _check_restored(deltas, collection, step)
    print(
        f"training: {num_steps:,} steps in {train_s:.1f} s; the last delta over its base equals the table bit for bit"
    )
    print(f"delta_fraction={fraction:.4f}")


def _sparse_step(
    collection: ShardedEmbeddingCollection,
    optimizer: SparseOptimizer,
    rng: np.random.Generator,
    upstream: list[torch.Tensor],
) -> None:
    ids = rng.zipf(1.1, size=(len(FEATURES), BATCH)) % collection.tables[0].num_rows
    offsets = torch.arange(BATCH + 1)
    outputs = collection(
        SparseFeatures({name: JaggedIds(torch.from_numpy(ids[i]), offsets) for i, name in enumerate(FEATURES)})
    )
    torch.autograd.backward([outputs[name] for name in FEATURES], upstream)
    optimizer.step()
    optimizer.zero_grad()


def _save_delta(manager: CheckpointManager, collection: ShardedEmbeddingCollection, step: int) -> None:
    manager.save(step, {}, {"sharded": {"embeddings": collection.delta_state_dict(0)}}, base_step=0)


def _save_full(manager: CheckpointManager, collection: ShardedEmbeddingCollection, step: int) -> None:
    manager.save(step, {}, {"sharded": {"embeddings": collection.sharded_state_dict()}})


def _bytes_of(manager: CheckpointManager, step: int) -> int:
    return next(info.size_bytes for info in manager.list_checkpoints() if info.step == step)


def _check_restored(manager: CheckpointManager, collection: ShardedEmbeddingCollection, step: int) -> None:
    restored = rank_state(manager.load(step), 0)["sharded"]["embeddings"]["tables"]["shared"]
    live = collection.sharded_state_dict()["tables"]["shared"]
    same = torch.equal(restored["weight"], live["weight"]) and all(
        torch.equal(restored["optimizer_state"][key], tensor) for key, tensor in live["optimizer_state"].items()
    )
    if not same:
        raise SystemExit("The delta put over its base differs from the table.")


def _async_save_and_step(manager: CheckpointManager, training: Training, step: int) -> tuple[float, float]:
    """The time the loop is blocked by an async save and the next step, and that step's whole time."""
    start = time.perf_counter()
    manager.save(step, training.state(), blocking=False, unchanged_until_staged=training.unchanged_until_staged)
    returned = time.perf_counter()
    training.forward_backward()
    backward_done = time.perf_counter()
    manager.wait_until_staged()
    staged = time.perf_counter()
    training.update()
    end = time.perf_counter()
    return (returned - start) + (staged - backward_done), end - returned


def _train_step(training: Training, manager: CheckpointManager) -> None:
    training.forward_backward()
    manager.wait_until_staged()  # Nothing in flight: what the loop pays for asking.
    training.update()


def _save_and_drop_previous(state: object, path: Path, repetition: int) -> None:
    torch.save(state, path)
    path.with_name(f"plain_{repetition - 1}.pt").unlink(missing_ok=True)


def _sha256_of_file(path: Path) -> str:
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def _timed_write(action: Callable[..., object], *args: object) -> float:
    os.sync()
    return _timed(action, *args)


def _timed(action: Callable[..., object], *args: object, **kwargs: object) -> float:
    start = time.perf_counter()
    action(*args, **kwargs)
    return time.perf_counter() - start


def _row(label: str, seconds: float, size_mb: float | None, ratio: str = "") -> None:
    throughput = "" if size_mb is None else f"{size_mb / seconds:.0f}"
    print(f"| {label} | {seconds:.4f} | {throughput} | {ratio} |")


def _median_ratio(numerators: list[float], denominators: list[float]) -> float:
    return statistics.median(n / d for n, d in zip(numerators, denominators))


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
