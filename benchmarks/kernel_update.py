"""Time the fused sparse-optimizer update alone: the numba CPU kernel against the torch reference.

The batch is a DLRM-like one: 4096 samples with 26 Zipf(1.1) ids each into one 1,000,000 x 64
table, sum-pooled, so each sample's pooled gradient row feeds its 26 occurrences.

    python benchmarks/kernel_update.py [--optimizers adam rowwise_adagrad] [--repeats 20] [--threads N]

``--threads`` (default: torch's default) sets both torch's and numba's thread counts.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from collections.abc import Callable

os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".numba_cache"))

import numba
import numpy as np
import torch

from embedding.kernels import fused_step
from embedding.optimizers import SPARSE_OPTIMIZERS, init_optimizer_state, sparse_optimizer_config

NUM_ROWS = 1_000_000
DIM = 64
BATCH_SIZE = 4096
IDS_PER_SAMPLE = 26
ZIPF_EXPONENT = 1.1


def median_ms(fn: Callable[[], None], repeats: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--optimizers", nargs="+", default=SPARSE_OPTIMIZERS.names(), choices=SPARSE_OPTIMIZERS.names())
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    # numba first: its first call starts its thread pool, which under the OpenMP layer sets
    # the OpenMP thread count that torch shares, undoing an earlier torch.set_num_threads.
    numba.set_num_threads(args.threads)
    torch.set_num_threads(args.threads)

    rng = np.random.default_rng(0)
    num_ids = BATCH_SIZE * IDS_PER_SAMPLE
    ids = torch.from_numpy(rng.zipf(ZIPF_EXPONENT, num_ids) % NUM_ROWS)
    grad_rows = torch.from_numpy(rng.standard_normal((BATCH_SIZE, DIM), dtype=np.float32))
    grad_index = torch.arange(num_ids) // IDS_PER_SAMPLE

    print(
        f"table {NUM_ROWS} x {DIM}, {num_ids} ids ({ids.unique().numel()} unique), "
        f"threads: torch {torch.get_num_threads()}, numba {numba.get_num_threads()} "
        f"({numba.threading_layer()} layer), median of {args.repeats}"
    )
    for name in args.optimizers:
        config = sparse_optimizer_config(name)
        weight = torch.randn(NUM_ROWS, DIM)
        state = init_optimizer_state(config, NUM_ROWS, DIM)
        timings = {}
        for backend in ("reference", "cpu"):
            update = functools.partial(
                fused_step, config, weight, state, ids, grad_rows, grad_index, None, 1, backend=backend
            )
            timings[backend] = median_ms(update, args.repeats)
        ratio = timings["reference"] / timings["cpu"]
        print(
            f"{name:>16}: reference {timings['reference']:7.2f} ms   cpu {timings['cpu']:6.2f} ms   "
            f"speed-up {ratio:5.1f}x"
        )


if __name__ == "__main__":
    main()
