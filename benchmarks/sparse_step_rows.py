"""What a half-precision row costs the sparse step: its two table-touching parts by row dtype, and the arithmetic.

The table-touching parts of ``sparse_step.py``'s step on its shared layout (1,000,000 x 64 rows, uniform in
+-0.001, 4096 x 26 Zipf(1.1) ids): the fused row-wise Adagrad update alone (``fused_step``) and the pooled
lookup alone (``embedding_bag`` for float32, :func:`embedding.kernels.half_pooling.pooled_half_rows` for the
others), each dtype in turn, step after step; then the widening and the stochastic rounding of a row that is
already in the cache (the arithmetic a half-precision row adds, without its loads), per row. One thread, process
time (the CPU time of this process: another process's load weighs on it less than on the wall clock), medians.

    python benchmarks/sparse_step_rows.py [--steps 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".numba_cache"))

import numba
import numpy as np
import torch
import torch.nn.functional as F
from numba import njit

from embedding.kernels import RowKeys, SortedIds, fused_step
from embedding.kernels.half_pooling import pooled_half_rows
from embedding.kernels.half_rows import round_row, widen_row
from embedding.kernels.rounding import kind_of
from embedding.optimizers import init_optimizer_state, sparse_optimizer_config

NUM_ROWS = 1_000_000
DIM = 64
NUM_IDS = 4096 * 26
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
CACHED_ROWS = 16
ROW_REPEATS = 1_000_000


@njit(cache=True)
def _widen_and_round(weight_bits, repeats, kind):  # type: ignore[no-untyped-def]
    """Widen and round back the cached rows of ``weight_bits`` in turn, ``repeats`` rows in all."""
    widened = np.empty((1, weight_bits.shape[1]), dtype=np.float32)
    widened_bits = widened.view(np.uint32)
    for repeat in range(repeats):
        row = repeat % weight_bits.shape[0]
        widen_row(weight_bits, row, widened, kind)
        round_row(widened_bits, weight_bits, row, np.uint64(repeat), kind)


def process_ms(call: Callable[..., object], *args: Any, **kwargs: Any) -> float:
    """The process time of ``call(*args, **kwargs)``, in ms."""
    start = time.process_time()
    call(*args, **kwargs)
    return (time.process_time() - start) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=15)
    args = parser.parse_args()
    numba.set_num_threads(1)
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    ids = torch.from_numpy(rng.zipf(1.1, NUM_IDS) % NUM_ROWS)
    sorted_ids = SortedIds.of(ids, NUM_ROWS)
    grad_rows = torch.from_numpy(rng.standard_normal((4096, DIM), dtype=np.float32))
    grad_index = torch.arange(NUM_IDS) // 26
    offsets = torch.arange(NUM_IDS + 1)
    config = sparse_optimizer_config("rowwise_adagrad")
    keys = RowKeys.of_buffer(NUM_ROWS, salt=1)
    rows = (torch.rand(NUM_ROWS, DIM, generator=torch.Generator().manual_seed(0)) * 2 - 1) * 0.001
    tables = {dtype: (rows.to(dtype), init_optimizer_state(config, NUM_ROWS, DIM)) for dtype in DTYPES}
    del rows

    def lookup(weight: torch.Tensor) -> object:
        if weight.dtype == torch.float32:
            return F.embedding_bag(ids, weight, offsets, mode="sum", include_last_offset=True)
        return pooled_half_rows(weight, ids, offsets, None)

    times: dict[tuple[str, torch.dtype], list[float]] = {}
    for step in range(1, args.steps + 3):
        for dtype, (weight, state) in tables.items():
            update = process_ms(
                fused_step,
                config,
                weight,
                state,
                ids,
                (grad_rows,),
                grad_index,
                None,
                step,
                sorted_ids=sorted_ids,
                row_keys=keys,
            )
            pooled = process_ms(lookup, weight)
            if step > 2:  # the first two compile and warm up
                times.setdefault(("update", dtype), []).append(update)
                times.setdefault(("lookup", dtype), []).append(pooled)
    print(f"{NUM_IDS} ids, {sorted_ids.keys.unique().numel()} distinct rows; 1 thread, process time, ms, medians")
    print("| part | " + " | ".join(str(dtype).removeprefix("torch.") for dtype in DTYPES) + " |")
    print("| --- |" + " ---: |" * len(DTYPES))
    for part in ("update", "lookup"):
        print(f"| {part} | " + " | ".join(f"{statistics.median(times[part, dtype]):.2f}" for dtype in DTYPES) + " |")
    cells = []
    for dtype in DTYPES[1:]:
        cached = tables[dtype][0][:CACHED_ROWS].clone().view(torch.int16).numpy().view(np.uint16)
        _widen_and_round(cached, 10, kind_of(dtype))
        best = min(process_ms(_widen_and_round, cached, ROW_REPEATS, kind_of(dtype)) for _ in range(5))
        cells.append(f"{str(dtype).removeprefix('torch.')} {best * 1e6 / ROW_REPEATS:.1f}")
    print("widen and round a cached row, ns: " + ", ".join(cells))


if __name__ == "__main__":
    main()
