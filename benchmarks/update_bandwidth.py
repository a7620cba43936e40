"""The fused update's achieved memory bandwidth, as a fraction of the device's measured copy bandwidth.

Issue 5's GPU figure: a 10,000,000 x 128 float32 table and a batch of 65,536 samples x 26
features x 1 Zipf(1.1) id (fixed seed), one gradient row per id, as the sum-pooled lookup
records it. The update must move at least: every id and its gradient index (read), every
gradient row (read), and every touched row of the table and of its optimizer state (read and
written). Those bytes over the median time of ``fused_step`` (its sort included) give the
achieved bandwidth; a large copy of device memory (bytes read plus bytes written over its median
time) gives the ceiling.

    python benchmarks/update_bandwidth.py [--device cuda] [--optimizer rowwise_adagrad]
                                          [--rows 10000000] [--dim 128] [--batch 65536]

On a CPU (``--device cpu``, the numba kernel) the same figure says how close the CPU kernel
comes to the machine's copy bandwidth.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".numba_cache"))

import numpy as np
import torch

from embedding.kernels import fused_step
from embedding.optimizers import SPARSE_OPTIMIZERS, SparseOptimizerConfig, init_optimizer_state, sparse_optimizer_config

NUM_FEATURES = 26
ZIPF_EXPONENT = 1.1
COPY_BYTES = 1 << 30


def median_seconds(action: Callable[[], object], device: torch.device, repeats: int, warmup: int = 3) -> float:
    """The median wall time of ``action``, waiting for the device before reading the clock."""
    for _ in range(warmup):
        action()
    times = []
    for _ in range(repeats):
        _synchronize(device)
        start = time.perf_counter()
        action()
        _synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(device: torch.device, repeats: int) -> float:
    """Bytes read plus bytes written per second by a 1 GiB device-to-device copy."""
    source = torch.rand(COPY_BYTES // 4, device=device)
    target = torch.empty_like(source)
    seconds = median_seconds(lambda: target.copy_(source), device, repeats)
    return 2 * COPY_BYTES / seconds


def update_bytes(config: SparseOptimizerConfig, ids: torch.Tensor, dim: int) -> int:
    """The fewest bytes one fused update moves: ids and gradient indices (int64) and gradient
    rows read once; each touched row of the table and of its state read and written once."""
    num_ids, num_rows_touched = ids.numel(), int(torch.unique(ids).numel())
    state_floats_per_row = sum(
        tensor[0].numel() for tensor in init_optimizer_state(config, 1, dim).values()
    )  # 0 (sgd), 1 (row-wise Adagrad), dim (Adagrad) or 2 * dim (Adam)
    read_once = num_ids * (8 + 8 + 4 * dim)
    read_and_written = 2 * num_rows_touched * 4 * (dim + state_floats_per_row)
    return read_once + read_and_written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--optimizer", default="rowwise_adagrad", choices=SPARSE_OPTIMIZERS.names())
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--batch", type=int, default=65_536)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    device = torch.device(args.device)

    config = sparse_optimizer_config(args.optimizer, lr=0.01)
    weight = torch.randn(args.rows, args.dim, device=device)
    state = init_optimizer_state(config, args.rows, args.dim, torch.float32, device)
    zipf = np.random.default_rng(0).zipf(ZIPF_EXPONENT, args.batch * NUM_FEATURES) % args.rows
    ids = torch.from_numpy(zipf).to(device)
    grad_rows = torch.randn(ids.numel(), args.dim, device=device)
    grad_index = torch.arange(ids.numel(), device=device)
    step = iter(range(1, 1 << 30))

    seconds = median_seconds(
        lambda: fused_step(config, weight, state, ids, grad_rows, grad_index, None, next(step)), device, args.repeats
    )
    moved = update_bytes(config, ids, args.dim)
    achieved, ceiling = moved / seconds, copy_bandwidth(device, args.repeats)

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"device: {name}; table {args.rows:,} x {args.dim}; {ids.numel():,} ids ({args.batch:,} x {NUM_FEATURES})")
    print(f"optimizer {args.optimizer}: {int(torch.unique(ids).numel()):,} rows touched, {moved / 1e6:,.0f} MB moved")
    print(f"fused update: median {seconds * 1e3:.2f} ms, {achieved / 1e9:.1f} GB/s")
    print(f"device copy: {ceiling / 1e9:.1f} GB/s (read + write, 1 GiB)")
    print(f"fraction of copy bandwidth: {achieved / ceiling:.2f} (goal on a GPU: at least 0.50)")


if __name__ == "__main__":
    main()
