"""Where the time of the sparse step goes: the step of ``sparse_step.py`` (ours, rowwise Adagrad) timed part by part.

Each part is timed around its own call inside the step (the framework's functions wrapped for the run):
grouping the features into bags, the sort of the ids for the update (in the forward, where the grouping makes
it, else in the optimizer step: a row says which), ``embedding_bag``, the rest of the forward, autograd's
backward, the kernel's input checks, the fused kernel and the rest of the optimizer step; also the minor page
faults per step (``ru_minflt``). Medians over ``--steps`` steps after ``--warmup``, each layout and row dtype
(``--dtypes``) in turn,
``--rounds`` times. The process keeps freed memory, as training does (``recipes.runtime.host_memory``).

    python benchmarks/sparse_step_parts.py [--threads 2] [--steps 70] [--warmup 10] [--rounds 2]
        [--dtypes float32 float16 bfloat16]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import statistics
import time
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".numba_cache"))

import numba
import torch

import embedding.collection
import embedding.kernels
import embedding.kernels.cpu
import embedding.lookup
from embedding import ShardedEmbeddingCollection, SparseOptimizer
from embedding.kernels import SortedIds
from embedding.optimizers.rowwise_adagrad import RowwiseAdagradConfig
from recipes.runtime.host_memory import keep_freed_memory
from sparse_step import DTYPES, FEATURES, make_features, table_configs, upstream_gradients  # benchmarks/sparse_step.py

Times = dict[str, list[float]]


@contextlib.contextmanager
def timed(times: Times, part: str, module: Any, name: str) -> Iterator[None]:
    """Time every call of ``module.name`` under ``part`` while the block runs."""
    original = getattr(module, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            times.setdefault(part, []).append((time.perf_counter() - start) * 1000)

    setattr(module, name, wrapper)
    try:
        yield
    finally:
        setattr(module, name, original)


@contextlib.contextmanager
def timed_kernel(times: Times, part: str, module: Any, factory: str) -> Iterator[None]:
    """Time every call of the kernels that ``module.factory`` builds (a compiled kernel per optimizer) under
    ``part`` while the block runs."""
    original = getattr(module, factory)

    def build(*args: Any, **kwargs: Any) -> Any:
        kernel = original(*args, **kwargs)

        def call(*kernel_args: Any) -> Any:
            start = time.perf_counter()
            try:
                return kernel(*kernel_args)
            finally:
                times.setdefault(part, []).append((time.perf_counter() - start) * 1000)

        return call

    setattr(module, factory, build)
    try:
        yield
    finally:
        setattr(module, factory, original)


def measure(layout: str, steps: int, warmup: int, dtype: str = "float32") -> dict[str, float]:
    tables = table_configs(layout, dtype)
    collection = ShardedEmbeddingCollection(tables)
    optimizer = SparseOptimizer(collection, RowwiseAdagradConfig())
    features, upstream = make_features(tables), upstream_gradients()
    times: Times = {}
    wrapped: list[tuple[str, Any, str]] = [
        ("grouping", embedding.collection, "group_bags"),
        ("embedding_bag", embedding.lookup, "_weighted_sum"),
        ("checks", embedding.kernels, "check_step_inputs"),
        ("sort", SortedIds, "of"),  # in the grouping, or in the kernel's call where the grouping did not sort
    ]
    with contextlib.ExitStack() as stack:
        for part, module, name in wrapped:
            stack.enter_context(timed(times, part, module, name))
        stack.enter_context(timed_kernel(times, "kernel", embedding.kernels.cpu, "_step_kernel"))
        for _ in range(warmup + steps):
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start = time.perf_counter()
            sorts_before = len(times.get("sort", []))
            outputs = collection(features)
            forward_end = time.perf_counter()
            sorted_in_forward = len(times.get("sort", [])) > sorts_before
            torch.autograd.backward([outputs[name] for name in FEATURES], [upstream[name] for name in FEATURES])
            backward_end = time.perf_counter()
            optimizer.step()
            optimizer.zero_grad()
            end = time.perf_counter()
            times.setdefault("forward", []).append((forward_end - start) * 1000)
            times.setdefault("backward", []).append((backward_end - forward_end) * 1000)
            times.setdefault("optimizer step", []).append((end - backward_end) * 1000)
            times.setdefault("step", []).append((end - start) * 1000)
            times.setdefault("page faults", []).append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)
    medians = {part: statistics.median(values[warmup:]) for part, values in times.items()}
    medians["forward, the rest"] = medians["forward"] - medians["grouping"] - medians["embedding_bag"]
    medians["optimizer step, the rest"] = medians["optimizer step"] - medians["checks"] - medians["kernel"]
    # The sort runs inside the grouping's call or inside the optimizer step's: counted there once.
    medians["grouping" if sorted_in_forward else "optimizer step, the rest"] -= medians["sort"]
    medians["sort, where"] = float(sorted_in_forward)
    return medians


PARTS = [
    "grouping",
    "sort",
    "sort, where",
    "embedding_bag",
    "forward, the rest",
    "backward",
    "checks",
    "kernel",
    "optimizer step, the rest",
    "step",
    "page faults",
]


WHERE = ("the optimizer step", "the forward")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=70)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dtypes", nargs="+", choices=DTYPES, default=["float32"])
    args = parser.parse_args()
    numba.set_num_threads(args.threads)  # numba first: its pool start resets the OpenMP threads torch shares
    torch.set_num_threads(args.threads)
    print(keep_freed_memory())
    print(f"threads: torch {args.threads}, numba {args.threads}; medians of {args.steps} steps, ms (faults: count)\n")
    rows: list[tuple[str, dict[str, float]]] = []
    for round_index in range(args.rounds):
        for layout, label in (("split", "26 tables"), ("shared", "shared")):
            for dtype in args.dtypes:
                medians = measure(layout, args.steps, args.warmup, dtype)
                rows.append((f"{label} {dtype}, round {round_index + 1}", medians))
    print("| part | " + " | ".join(label for label, _ in rows) + " |")
    print("| --- |" + " ---: |" * len(rows))
    for part in PARTS:
        if part == "sort, where":
            print("| sort made in | " + " | ".join(WHERE[int(medians[part])] for _, medians in rows) + " |")
        else:
            print(f"| {part} | " + " | ".join(f"{medians[part]:.2f}" for _, medians in rows) + " |")


if __name__ == "__main__":
    main()
