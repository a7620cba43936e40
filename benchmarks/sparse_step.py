"""One full sparse training step (lookup, backward, fused update) against torch's sparse baselines.

A batch of 4096 samples x 26 features x 1 id, Zipf-distributed (numpy zipf a=1.1, fixed seed),
over 1,000,000 rows of dim 64 in two layouts: 26 tables that together hold 1,000,000 rows (one
per feature), and one 1,000,000-row table shared by the 26 features. The baselines are
``nn.EmbeddingBag(sparse=True)`` with ``torch.optim.SparseAdam`` and with ``torch.optim.Adagrad``:
one bag per table, called once per step with the ids of all its features, as the collection
looks up each buffer once (calling the shared bag once per feature made its step about twice as
slow). Every method runs the same step on the same batch: lookup, backward from a fixed random
gradient of every feature's pooled output (what the dense part of a model would hand back),
the optimizer's ``step`` and ``zero_grad``. Methods take turns step by step; the table gives
each one's median and interquartile range.

A third layout, "shared, hash", is our rowwise_adagrad step on a hash table (``kind="hash"``,
eviction lru) of 1,000,000 slots looked up by all 26 features, the same Zipf ranks spread over
the int64 range by splitmix64 (distinct ranks stay distinct ids). It takes turns with the
others; its warm-up steps insert the batch's ids (the batch is the same at every step, and far
fewer than the slots), so the measured steps find them all. Its ratios are to the shared
layout's baselines, and the line after the table gives its time over the fixed shared table's.

Then the rowwise Adagrad step's share of the machine's copy bandwidth, in each fixed layout: the
bytes the step must move, counted as ``update_bandwidth.py`` counts them (ids and gradient
indices read, one gradient row per id read, every touched row of table and state read and
written) plus the pooled outputs written, over the median step time, against a 1 GiB copy
(bytes read plus written) that takes its turn among the methods: its median over the same
minutes. A copy measured apart, before or after, can see another machine: on one 2-core virtual
machine the same copy ran at 78 GB/s for half a minute, then at 45 (docs/benchmarks.md, "Sparse embedding step").

Row dtypes (``--dtypes``, default ``float32 float16``): our rowwise Adagrad step on tables of each other dtype
takes its turns beside the float32 one in both fixed layouts; ``fp16_speedup`` is the float32 step's median
time over the float16 step's, the lower of the two layouts (``bf16_speedup`` likewise). Where ``fbgemm_gpu``
imports (``pip install .[bench]``: fbgemm-gpu-cpu 1.8.0), FBGEMM's CPU table-batched embedding with exact row-wise
Adagrad on float32 host rows (``fbgemm_step.py``) takes its turns too, and ``fbgemm_ratio`` is its median time
over our float32 step's, the lower of the two layouts.

    python benchmarks/sparse_step.py [--steps 30] [--warmup 3] [--threads N] [--dtypes float32 float16 bfloat16]

``--threads`` (default: torch's default) sets both torch's and numba's thread counts. The process keeps
freed memory for reuse as training does (``recipes.runtime.host_memory``), for every method alike. The last
line but one reads ``ms_26_tables=A ms_shared=B copy_fraction=C`` (C: the lower of the two layouts' fractions), the
last the dtypes' speedups and ``fbgemm_ratio``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable

os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".numba_cache"))

import numba
import numpy as np
import torch
from torch import nn

from embedding import (
    EmbeddingTableConfig,
    EvictionConfig,
    HashPolicy,
    JaggedIds,
    ShardedEmbeddingCollection,
    SparseFeatures,
    SparseOptimizer,
)
from embedding.optimizers import sparse_optimizer_config
from fbgemm_step import fbgemm_layout_step
from hash_table import spread  # benchmarks/hash_table.py: ids spread over int64 as a log's hashes
from recipes.runtime.host_memory import keep_freed_memory
from update_bandwidth import COPY_BYTES

TOTAL_ROWS = 1_000_000
DIM = 64
BATCH = 4096
NUM_FEATURES = 26
FEATURES = [f"f{i}" for i in range(NUM_FEATURES)]
HASH_LAYOUT = "shared, hash"
COPY = ("", "1 GiB copy")
HASH_METHOD = "ours rowwise_adagrad"
FBGEMM = "FBGEMM exact rowwise_adagrad"
DTYPES = ("float32", "float16", "bfloat16")
SPEEDUP_NAMES = {"float16": "fp16_speedup", "bfloat16": "bf16_speedup"}


def table_configs(layout: str, dtype: str = "float32") -> list[EmbeddingTableConfig]:
    if layout == "shared":
        return [EmbeddingTableConfig("shared", TOTAL_ROWS, DIM, tuple(FEATURES), dtype=dtype)]  # type: ignore[arg-type]
    if layout == "hash":
        policy = HashPolicy(eviction=EvictionConfig("lru"))
        return [EmbeddingTableConfig("hashed", TOTAL_ROWS, DIM, tuple(FEATURES), kind="hash", hash_policy=policy)]
    rows = [TOTAL_ROWS // NUM_FEATURES + (i < TOTAL_ROWS % NUM_FEATURES) for i in range(NUM_FEATURES)]
    return [
        EmbeddingTableConfig(f"t{i}", rows[i], DIM, (name,), dtype=dtype)  # type: ignore[arg-type]
        for i, name in enumerate(FEATURES)
    ]


def make_features(tables: list[EmbeddingTableConfig]) -> SparseFeatures:
    """The batch: Zipf ranks modulo a fixed table's rows, or spread over int64 for a hash table."""
    rng = np.random.default_rng(0)
    zipf = rng.zipf(1.1, size=(NUM_FEATURES, BATCH))
    table_of = {feature: table for table in tables for feature in table.features}

    def ids(i: int, name: str) -> np.ndarray:
        table = table_of[name]
        return spread(zipf[i]) if table.kind == "hash" else zipf[i] % table.num_rows

    return SparseFeatures(
        {name: JaggedIds.from_dense(torch.from_numpy(ids(i, name)).view(BATCH, 1)) for i, name in enumerate(FEATURES)}
    )


def upstream_gradients() -> dict[str, torch.Tensor]:
    """The gradient of each feature's pooled output, the same at every step."""
    generator = torch.Generator().manual_seed(1)
    return {name: torch.randn(BATCH, DIM, generator=generator) for name in FEATURES}


def ours(tables: list[EmbeddingTableConfig], optimizer_name: str) -> Callable[[], None]:
    collection = ShardedEmbeddingCollection(tables)
    optimizer = SparseOptimizer(collection, sparse_optimizer_config(optimizer_name))
    features, upstream = make_features(tables), upstream_gradients()

    def step() -> None:
        outputs = collection(features)
        torch.autograd.backward([outputs[name] for name in FEATURES], [upstream[name] for name in FEATURES])
        optimizer.step()
        optimizer.zero_grad()

    return step


def baseline(tables: list[EmbeddingTableConfig], optimizer_name: str) -> Callable[[], None]:
    bags = {table.name: nn.EmbeddingBag(table.num_rows, DIM, mode="sum", sparse=True) for table in tables}
    parameters = [bag.weight for bag in bags.values()]
    optimizer: torch.optim.Optimizer
    if optimizer_name == "SparseAdam":
        optimizer = torch.optim.SparseAdam(parameters, lr=0.01)
    else:
        optimizer = torch.optim.Adagrad(parameters, lr=0.01)
    features, upstream = make_features(tables), upstream_gradients()
    # Every feature has one id per sample: the bags of a table's features, one after the other,
    # are its ids one by one.
    table_ids = {table.name: torch.cat([features[name].ids for name in table.features]) for table in tables}
    table_offsets = {name: torch.arange(ids.numel()) for name, ids in table_ids.items()}

    def step() -> None:
        outputs, grads = [], []
        for table in tables:
            pooled = bags[table.name](table_ids[table.name], table_offsets[table.name])
            outputs.extend(torch.split(pooled, BATCH))
            grads.extend(upstream[name] for name in table.features)
        torch.autograd.backward(outputs, grads)
        optimizer.step()
        optimizer.zero_grad()

    return step


LAYOUTS = ("26 tables", "shared")

METHODS: list[tuple[str, Callable[[list[EmbeddingTableConfig], str], Callable[[], None]], str]] = [
    ("EmbeddingBag+SparseAdam", baseline, "SparseAdam"),
    ("EmbeddingBag+Adagrad", baseline, "Adagrad"),
    ("ours rowwise_adagrad", ours, "rowwise_adagrad"),
    ("ours adam", ours, "adam"),
]


def step_times_ms(
    steps_by_method: dict[tuple[str, str], Callable[[], None]], steps: int, warmup: int
) -> dict[tuple[str, str], list[float]]:
    """The times of ``steps`` steps of every method; the methods take turns, step by step, so
    that the load of other processes on the machine weighs on them alike, in a new (seeded)
    order at every turn: a step runs slower right after a step that churned through memory
    (the torch baselines allocate and free hundreds of MB), and in a fixed order the same
    method always paid for it."""
    for step in steps_by_method.values():
        for _ in range(warmup):
            step()
    times: dict[tuple[str, str], list[float]] = {method: [] for method in steps_by_method}
    order = list(steps_by_method)
    shuffler = random.Random(0)
    for _ in range(steps):
        shuffler.shuffle(order)
        for method in order:
            step = steps_by_method[method]
            start = time.perf_counter()
            step()
            times[method].append((time.perf_counter() - start) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--dtypes", nargs="+", choices=DTYPES, default=["float32", "float16"])
    args = parser.parse_args()
    # numba first: its first call starts its thread pool, which under the OpenMP layer sets
    # the OpenMP thread count that torch shares, undoing an earlier torch.set_num_threads.
    numba.set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    memory_line = keep_freed_memory()  # as training runs the step

    print(f"command: {' '.join([sys.executable, *sys.argv])}")
    print(memory_line)
    print(f"batch {BATCH} x {NUM_FEATURES} features x 1 id, dim {DIM}, {args.steps} steps after {args.warmup} warm-up")
    print("layouts: '26 tables' = 26 tables holding 1,000,000 rows together, one per feature;")
    print("         'shared' = one 1,000,000-row table looked up by all 26 features;")
    print(f"         '{HASH_LAYOUT}' = a hash table of 1,000,000 slots (eviction lru) looked up by all 26 features,")
    print("         ids spread over int64; ratios to the shared layout's baselines\n")
    # Both layouts' methods take turns too, so that the two layouts are compared under one load.
    steps_by_method = {
        (layout, method): build(table_configs("shared" if layout == "shared" else "split"), optimizer_name)
        for layout in LAYOUTS
        for method, build, optimizer_name in METHODS
    }
    for layout in LAYOUTS:
        for dtype in args.dtypes:
            if dtype != "float32":
                tables = table_configs("shared" if layout == "shared" else "split", dtype)
                steps_by_method[layout, f"{HASH_METHOD} {dtype}"] = ours(tables, "rowwise_adagrad")
        fbgemm = fbgemm_of(table_configs("shared" if layout == "shared" else "split"))
        if fbgemm is not None:
            steps_by_method[layout, FBGEMM] = fbgemm
    steps_by_method[HASH_LAYOUT, HASH_METHOD] = ours(table_configs("hash"), "rowwise_adagrad")
    steps_by_method[COPY] = copy_step()
    times = step_times_ms(steps_by_method, args.steps, args.warmup)
    copy_ms = times.pop(COPY)
    medians = {key: statistics.median(key_times) for key, key_times in times.items()}
    print(f"threads: torch {torch.get_num_threads()}, numba {numba.get_num_threads()} ({numba.threading_layer()})\n")
    print("| layout | method | median ms/step | IQR ms | vs EmbeddingBag+SparseAdam | vs EmbeddingBag+Adagrad |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for (layout, method), ms in medians.items():
        low, _, high = statistics.quantiles(times[layout, method], n=4)
        baseline_layout = "shared" if layout == HASH_LAYOUT else layout
        sparse_adam = medians[baseline_layout, "EmbeddingBag+SparseAdam"] / ms
        adagrad = medians[baseline_layout, "EmbeddingBag+Adagrad"] / ms
        print(f"| {layout} | {method} | {ms:.2f} | {low:.1f}-{high:.1f} | {sparse_adam:.2f}x | {adagrad:.2f}x |")
    hash_ratio = medians[HASH_LAYOUT, HASH_METHOD] / medians["shared", HASH_METHOD]
    print(f"{HASH_METHOD}: hash table / fixed shared table time {hash_ratio:.2f}")
    for method, _, _ in METHODS[2:]:
        print(f"{method}: shared / 26 tables time {medians['shared', method] / medians['26 tables', method]:.2f}")

    ceiling = 2 * COPY_BYTES / (statistics.median(copy_ms) / 1e3)
    slow, _, fast = (2 * COPY_BYTES / (ms / 1e3) / 1e9 for ms in statistics.quantiles(copy_ms, n=4)[::-1])
    print(f"\n{COPY[1]}, in turn with the steps: median {ceiling / 1e9:.1f} GB/s (IQR {slow:.1f}-{fast:.1f})")
    fractions = {}
    for layout in LAYOUTS:
        moved = step_bytes(table_configs("shared" if layout == "shared" else "split"))
        seconds = medians[layout, HASH_METHOD] / 1e3
        fractions[layout] = moved / seconds / ceiling
        print(
            f"{HASH_METHOD}, {layout}: {moved / 1e6:.1f} MB moved in {seconds * 1e3:.2f} ms = "
            f"{moved / seconds / 1e9:.1f} GB/s, {fractions[layout]:.2f} of the copy's {ceiling / 1e9:.1f} GB/s"
        )
    print(
        f"ms_26_tables={medians['26 tables', HASH_METHOD]:.2f} ms_shared={medians['shared', HASH_METHOD]:.2f} "
        f"copy_fraction={min(fractions.values()):.2f}"
    )
    print(last_line(medians, args.dtypes))


def fbgemm_of(tables: list[EmbeddingTableConfig]) -> Callable[[], None] | None:
    """FBGEMM's step on the same tables, batch and upstream gradients; ``None`` without ``fbgemm_gpu``."""
    features = make_features(tables)
    feature_ids = {name: features[name].ids for name in FEATURES}
    layout = {table.name: (table.num_rows, table.features) for table in tables}
    return fbgemm_layout_step(layout, DIM, feature_ids, upstream_gradients())


def last_line(medians: dict[tuple[str, str], float], dtypes: list[str]) -> str:
    """Each dtype's speedup over float32 and FBGEMM's time over our float32 step's, the lower of the two layouts."""
    fields = []
    for dtype in dtypes:
        if dtype != "float32":
            speedups = [medians[layout, HASH_METHOD] / medians[layout, f"{HASH_METHOD} {dtype}"] for layout in LAYOUTS]
            fields.append(f"{SPEEDUP_NAMES[dtype]}={min(speedups):.2f}")
    if ("shared", FBGEMM) in medians:
        ratios = [medians[layout, FBGEMM] / medians[layout, HASH_METHOD] for layout in LAYOUTS]
        fields.append(f"fbgemm_ratio={min(ratios):.2f}")
    else:
        fields.append("fbgemm_ratio=n/a (fbgemm_gpu does not import: pip install .[bench])")
    return " ".join(fields)


def copy_step() -> Callable[[], None]:
    """A copy of ``COPY_BYTES`` (read once, written once), the ceiling the step's bytes are measured against."""
    source = torch.rand(COPY_BYTES // 4)
    target = torch.empty_like(source)

    def step() -> None:
        target.copy_(source)

    return step


def step_bytes(tables: list[EmbeddingTableConfig]) -> int:
    """The fewest bytes a rowwise Adagrad step moves: ids and gradient indices (int64) and one gradient row
    per id read once; each touched row of a table and its row-wise state read and written once; every
    feature's pooled output written once."""
    features = make_features(tables)
    table_of = {feature: table.name for table in tables for feature in table.features}
    touched: dict[str, set[int]] = {}
    for name in FEATURES:
        touched.setdefault(table_of[name], set()).update(features[name].ids.tolist())
    num_ids = BATCH * NUM_FEATURES
    rows_touched = sum(len(rows) for rows in touched.values())
    read_once = num_ids * (8 + 8 + 4 * DIM)
    read_and_written = 2 * rows_touched * 4 * (DIM + 1)
    return read_once + read_and_written + num_ids * 4 * DIM


if __name__ == "__main__":
    main()
