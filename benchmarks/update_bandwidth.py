"""The fused update against the same optimizer written in torch ops, and its achieved memory
bandwidth as a fraction of the device's measured copy bandwidth.

Issue 34's GPU figures: a 10,000,000 x 128 float32 table and a batch of 65,536 samples x 26
features x 1 Zipf(1.1) id (fixed seed), one gradient row per id, as the sum-pooled lookup
records it. The update must move at least: every id and its gradient index (read), every
gradient row (read), and every touched row of the table and of its optimizer state (read and
written). Those bytes over the median time of ``fused_step`` (its sort and input checks
included) give the achieved bandwidth; a large copy of device memory (bytes read plus bytes
written over its median time) gives the ceiling. The torch-ops version is the kernels' own
oracle (``backend="reference"``: ``torch.unique``, ``index_add_``, the optimizer's update
functions on whole tensors), timed on the same ids in the same run. Each optimizer's fused step
is also run twice from the same table (the same bits both times, or ``deterministic=no``) and
once against the oracle (``max_rel_diff``).

    python benchmarks/update_bandwidth.py [--device cuda] [--optimizer rowwise_adagrad|all]
                                          [--rows 10000000] [--dim 128] [--batch 65536] [--profile]

On a CPU (``--device cpu``, the numba kernel) the same figures say how close the CPU kernel comes
to the machine's copy bandwidth. ``--profile`` prints where one fused step's device time goes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from functools import partial

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
        synchronize(device)
        start = time.perf_counter()
        action()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def synchronize(device: torch.device) -> None:
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


class Workload:
    """One optimizer's table, state and batch, and its fused and torch-ops steps on them."""

    def __init__(self, optimizer: str, args: argparse.Namespace, device: torch.device) -> None:
        self.config = sparse_optimizer_config(optimizer, lr=0.01)
        self.weight = torch.randn(args.rows, args.dim, device=device)
        self.state = init_optimizer_state(self.config, args.rows, args.dim, torch.float32, device)
        zipf = np.random.default_rng(0).zipf(ZIPF_EXPONENT, args.batch * NUM_FEATURES) % args.rows
        self.ids = torch.from_numpy(zipf).to(device)
        self.grad_rows = torch.randn(self.ids.numel(), args.dim, device=device)
        self.grad_index = torch.arange(self.ids.numel(), device=device)
        self.step = 0

    def run(self, backend: str | None = None) -> None:
        """One step of ``backend`` (the device's fused kernel by default) on the live table."""
        self.step += 1
        self.run_on(self.weight, self.state, backend)

    def run_on(self, weight: torch.Tensor, state: dict[str, torch.Tensor], backend: str | None) -> None:
        fused_step(
            self.config, weight, state, self.ids, self.grad_rows, self.grad_index, None, max(self.step, 1),
            backend=backend,
        )  # fmt: skip

    def agreement(self) -> tuple[bool, float]:
        """Whether two fused steps from the same table end with the same bits, and the fused
        step's largest difference from the oracle's, relative to the largest touched weight."""
        touched = torch.unique(self.ids)
        results = []
        for backend in (None, None, "reference"):
            weight = self.weight[touched].clone()
            state = {name: tensor[touched].clone() for name, tensor in self.state.items()}
            remapped = Workload.__new__(Workload)
            remapped.__dict__.update(self.__dict__, ids=torch.searchsorted(touched, self.ids))
            remapped.run_on(weight, state, backend)
            results.append((weight, state))
        (first, first_state), (second, second_state), (oracle, _) = results
        same = torch.equal(first, second) and all(torch.equal(first_state[k], second_state[k]) for k in first_state)
        return same, float((first - oracle).abs().max() / oracle.abs().max())


def profile_step(workload: Workload, device: torch.device) -> None:
    """Where one fused step's time goes: each device kernel's time and the host's, per step."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    steps = 5
    with profile(activities=activities) as profiler:
        for _ in range(steps):
            workload.run()
        synchronize(device)
    sort_key = "device_time_total" if device.type == "cuda" else "cpu_time_total"
    print(profiler.key_averages().table(sort_by=sort_key, row_limit=14, max_name_column_width=48))
    print(f"(totals over {steps} steps)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--optimizer", default="rowwise_adagrad", choices=[*SPARSE_OPTIMIZERS.names(), "all"])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--batch", type=int, default=65_536)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--profile", action="store_true", help="print where one fused step's time goes")
    args = parser.parse_args()
    device = torch.device(args.device)

    ceiling = copy_bandwidth(device, args.repeats)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"device: {name}; table {args.rows:,}x{args.dim}; ids {args.batch:,} x {NUM_FEATURES}, Zipf {ZIPF_EXPONENT}")
    print(f"device copy: {ceiling / 1e9:.1f} GB/s (read + write, 1 GiB)")
    optimizers = SPARSE_OPTIMIZERS.names() if args.optimizer == "all" else [args.optimizer]
    for optimizer in optimizers:
        workload = Workload(optimizer, args, device)
        fused = median_seconds(workload.run, device, args.repeats)
        in_torch_ops = median_seconds(partial(workload.run, "reference"), device, max(3, args.repeats // 4))
        deterministic, max_rel_diff = workload.agreement()
        moved = update_bytes(workload.config, workload.ids, args.dim)
        print(
            f"optimizer={optimizer} fused_ms={fused * 1e3:.3f} torch_ops_ms={in_torch_ops * 1e3:.3f} "
            f"ratio_vs_torch={in_torch_ops / fused:.2f} MB_moved={moved / 1e6:,.0f} "
            f"fraction_of_copy={moved / fused / ceiling:.2f} deterministic={'yes' if deterministic else 'no'} "
            f"max_rel_diff={max_rel_diff:.1e}"
        )
        if args.profile:
            profile_step(workload, device)
        del workload


if __name__ == "__main__":
    main()
