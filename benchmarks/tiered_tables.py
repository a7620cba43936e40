"""A table bigger than the machine's memory, on disk behind a RAM cache, against a table in memory.

One table of ``--rows`` rows x 32 dims (300,000,000 by default: 39.6 GB of rows and row-wise Adagrad
state, more than this 24 GB machine holds) is stored on ``disk`` (a sparse file in a temporary
directory, deleted at the end) with a RAM cache of ``--cache-gb`` (2 GB, LRU); the baseline is the
same workload on a table of ``--memory-rows`` rows (10,000,000) on the device, in memory. Each
step is a batch of 4096 samples x 26 features x 1 id, the 26 features looking up the one table
(as the shared layout of ``sparse_step.py``), with fresh Zipf(1.1) ranks at every step (step
``i`` draws from seed ``i``, the same ranks for both tables) modulo the table's rows: forward
(pooled lookup), a squared loss, backward, the row-wise Adagrad ``SparseOptimizer.step``. As the
framework's train pipeline does, a background thread prepares the next batch
(``collection.prepare_ahead``: its ids grouped and, for the tiered table, the records its cache
lacks read from the store and, on a CPU, brought into the cache) while the current step runs;
the prefetch wait is the time the main thread then waits for that thread, per step.

Each table trains in a process of its own, so that each one's peak resident memory (``VmHWM``)
is its own (both keep freed memory for reuse, as training does); the two take turns, a round of
``--round`` steps each, so that the machine's load weighs on both alike. A round's samples/s
counts from its first batch's synchronous preparation to its last step's end (so the first step
of a round gets no prefetch); the figures are medians over rounds, and the ratio is taken per
round pair. Both first run ``--warmup`` steps, untimed: by step 600 the disk table's cache of
2 GB is full and evicting (each step then writes back more than half as many rows as it fetches),
which costs the most; a progress line every round shows it.

    python benchmarks/tiered_tables.py [--rows 300000000] [--memory-rows 10000000] [--cache-gb 2]
        [--warmup 600] [--steps 200] [--round 20] [--dir /tmp]

A line reads ``ratio_vs_memory=R hit_rate=H prefetch_wait_ms=W peak_rss_gb=P cache_gb=C``
(goals: R at least 0.5, P under C + 2).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".numba_cache"))

import numpy as np
import torch

from embedding import EmbeddingTableConfig, JaggedIds, ShardedEmbeddingCollection, SparseFeatures, SparseOptimizer
from embedding.optimizers import sparse_optimizer_config
from embedding.tiers import TableStorage
from recipes.runtime.host_memory import keep_freed_memory
from sparse_step import BATCH, FEATURES  # benchmarks/sparse_step.py: 4096 samples x 26 features, one table

DIM = 32
ZIPF = 1.1


def batch(step: int, num_rows: int) -> SparseFeatures:
    """Step ``step``'s batch: Zipf ranks from seed ``step``, modulo ``num_rows``."""
    ranks = np.random.default_rng(step).zipf(ZIPF, size=(len(FEATURES), BATCH)) % num_rows
    return SparseFeatures(
        {name: JaggedIds.from_dense(torch.from_numpy(ranks[i]).view(BATCH, 1)) for i, name in enumerate(FEATURES)}
    )


def peak_rss_bytes() -> int:
    """This process's peak resident memory (``VmHWM``)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/self/status must list VmHWM, but does not.")


@dataclass
class Round:
    """One round of steps: how many, their wall time and each step's wait for the prefetch thread."""

    steps: int
    seconds: float
    waits: list[float] = field(default_factory=list)


class Trainer:
    """A one-table collection and its sparse optimizer, stepping through batches prepared a step ahead."""

    def __init__(self, num_rows: int, storage: TableStorage, storage_dir: str | None) -> None:
        table = EmbeddingTableConfig("table", num_rows, DIM, tuple(FEATURES), storage=storage)
        self.num_rows = num_rows
        self.collection = ShardedEmbeddingCollection(
            [table], seed=0, optimizer=sparse_optimizer_config("rowwise_adagrad", lr=0.05), storage_dir=storage_dir
        )
        self.optimizer = SparseOptimizer(self.collection)
        self._ahead = ThreadPoolExecutor(1)

    def prepare(self, step: int) -> SparseFeatures:
        return self.collection.prepare_ahead(batch(step, self.num_rows), self.collection.gang)

    def step(self, features: SparseFeatures) -> None:
        outputs = self.collection(features)
        loss = torch.stack([pooled.sum(1) for pooled in outputs.values()]).sub(0.5).square().mean()
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()

    def run(self, first: int, count: int) -> Round:
        """Steps ``first`` to ``first + count - 1``, each next batch prepared on the thread during a step."""
        started = time.perf_counter()
        features = self.prepare(first)
        waits = []
        for step in range(first, first + count):
            ahead: Future[SparseFeatures] | None = None
            if step + 1 < first + count:
                ahead = self._ahead.submit(self.prepare, step + 1)
            self.step(features)
            if ahead is not None:
                waited = time.perf_counter()
                features = ahead.result()
                waits.append(time.perf_counter() - waited)
        return Round(count, time.perf_counter() - started, waits)

    def statistics(self) -> dict[str, float]:
        tier = self.collection.groups[0].tier
        found = dict(tier.statistics) if tier is not None else {}
        if tier is not None:
            found["write_seconds"] = tier.behind.write_seconds
        found["peak_rss_bytes"] = peak_rss_bytes()
        return found


def serve(connection: Connection, num_rows: int, storage: TableStorage, storage_dir: str | None) -> None:
    """A child process: build the trainer, then run the rounds the parent asks for."""
    keep_freed_memory()  # as training runs the step
    trainer = Trainer(num_rows, storage, storage_dir)
    while (request := connection.recv()) is not None:
        if request == "statistics":
            connection.send(trainer.statistics())
        else:
            connection.send(trainer.run(*request))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300_000_000, help="rows of the table on disk")
    parser.add_argument("--memory-rows", type=int, default=10_000_000, help="rows of the table in memory")
    parser.add_argument("--cache-gb", type=float, default=2.0, help="the disk table's RAM cache, GB (1e9 bytes)")
    parser.add_argument("--warmup", type=int, default=600, help="untimed steps first")
    parser.add_argument("--steps", type=int, default=200, help="timed steps of each table")
    parser.add_argument("--round", type=int, default=20, help="steps of one table before the other's turn")
    parser.add_argument("--dir", default=None, help="where the disk store's temporary directory goes")
    args = parser.parse_args()
    cache_bytes = int(args.cache_gb * 1e9)
    print(f"command: {' '.join([sys.executable, *sys.argv])}")
    print(f"load before: {os.getloadavg()[0]:.2f} (1-minute average), {os.cpu_count()} cores")
    directory = tempfile.mkdtemp(prefix="tiered_tables_", dir=args.dir)
    context = multiprocessing.get_context("spawn")
    kinds = {
        "disk": (args.rows, TableStorage("disk", cache_bytes=cache_bytes), directory),
        "memory": (args.memory_rows, TableStorage(), None),
    }
    connections, processes = {}, []
    try:
        for kind, (num_rows, storage, storage_dir) in kinds.items():
            parent, child = context.Pipe()
            process = context.Process(target=serve, args=(child, num_rows, storage, storage_dir))
            process.start()
            connections[kind], processes = parent, [*processes, process]
        report(connections, args)
        print(f"load after: {os.getloadavg()[0]:.2f}")
    finally:
        for connection in connections.values():
            with contextlib.suppress(OSError):  # a child that failed is gone already
                connection.send(None)
        for process in processes:
            process.join()
        print(f"deleting {directory} (minutes where the file system discards each freed extent)", flush=True)
        shutil.rmtree(directory)


def report(connections: dict[str, Connection], args: argparse.Namespace) -> None:
    """Warm both up, time their rounds in turn, and print the figures."""
    print(
        f"batch {BATCH} x {len(FEATURES)} features x 1 id, Zipf({ZIPF}), dim {DIM}, rowwise_adagrad; disk table "
        f"{args.rows:,} rows (cache {args.cache_gb:g} GB, lru), memory table {args.memory_rows:,} rows"
    )
    started = time.perf_counter()
    for first in range(0, args.warmup, args.round):
        warm = _rounds(connections, first, min(args.round, args.warmup - first))
        print(f"warm-up steps {first}-: disk {warm[0].seconds:.1f} s, memory {warm[1].seconds:.1f} s", flush=True)
    print(f"warm-up: {args.warmup} steps each in {time.perf_counter() - started:.0f} s")
    before = _statistics(connections["disk"])
    end = args.warmup + args.steps
    rounds = [
        _rounds(connections, first, min(args.round, end - first)) for first in range(args.warmup, end, args.round)
    ]
    after = {kind: _statistics(connection) for kind, connection in connections.items()}

    rates = [[BATCH * round_.steps / round_.seconds for round_ in pair] for pair in rounds]
    ratio = statistics.median(disk / memory for disk, memory in rates)
    waits = [statistics.median(wait for pair in rounds for wait in pair[index].waits) for index in (0, 1)]
    delta = {key: after["disk"][key] - before[key] for key in before}
    print(
        f"{args.steps} timed steps each after {args.warmup} warm-up steps, in rounds of {args.round}; "
        "medians over rounds"
    )
    for index, kind in enumerate(("disk", "memory")):
        rate = statistics.median(pair[index] for pair in rates)
        print(f"{kind} table: {rate:,.0f} samples/s, prefetch wait {waits[index] * 1e3:.2f} ms/step (median)")
    print(
        f"disk cache per step: {delta['fetched'] / args.steps:,.0f} rows fetched "
        f"({delta['read_ahead'] / args.steps:,.0f} of them read ahead), "
        f"{delta['written_back'] / args.steps:,.0f} written back, "
        f"{delta['read_seconds'] / args.steps * 1e3:.1f} ms in the main thread's reads, "
        f"{delta['write_seconds'] / args.steps * 1e3:.1f} ms in the writer thread's writes"
    )
    peak = {kind: found["peak_rss_bytes"] / 1e9 for kind, found in after.items()}
    print(f"peak RSS: disk table's process {peak['disk']:.2f} GB, memory table's {peak['memory']:.2f} GB")
    print(
        f"ratio_vs_memory={ratio:.2f} hit_rate={delta['hits'] / delta['lookups']:.3f} "
        f"prefetch_wait_ms={waits[0] * 1e3:.2f} peak_rss_gb={peak['disk']:.2f} cache_gb={args.cache_gb:g}"
    )


def _rounds(connections: dict[str, Connection], first: int, count: int) -> tuple[Round, Round]:
    """Steps ``first`` to ``first + count - 1`` of the disk table, then of the memory table."""
    done = []
    for kind in ("disk", "memory"):
        connections[kind].send((first, count))
        done.append(connections[kind].recv())
    return done[0], done[1]


def _statistics(connection: Connection) -> dict[str, float]:
    connection.send("statistics")
    found: dict[str, float] = connection.recv()
    return found


if __name__ == "__main__":
    main()
