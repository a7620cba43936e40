"""The CUDA fused step's tuning constants tried against each other on the update_bandwidth workload.

The step's speed on a GPU hangs on a few constants (``embedding.kernels.cuda_kernels.CHUNK`` and
``OCCURRENCES_AT_ONCE``, ``embedding.kernels.cuda.THREADS_PER_BLOCK`` and
``BLOCKS_PER_MULTIPROCESSOR``) that only a GPU can choose. This runs one optimizer's fused step with
each combination on the same table and ids, in one process (the torch-ops version timed once, as the
baseline), prints one line per combination and the best, then ``torch.profiler``'s view of a step
with the best:

    python benchmarks/cuda_kernel_sweep.py [--optimizer rowwise_adagrad] [--dim 128]

Without a GPU, ``NUMBA_ENABLE_CUDASIM=1 ... --device cpu --rows 1000 --batch 8 --repeats 1`` runs the
script on numba's simulator (slowly; the times mean nothing there).

Each combination compiles the kernels again (2 s or so on an H200): 15 of them take about a minute.
"""

from __future__ import annotations

import argparse
import itertools
import time
from functools import partial

import torch

import update_bandwidth as workload_of
from embedding.kernels import cuda, cuda_kernels
from embedding.optimizers import SPARSE_OPTIMIZERS

CHUNKS = (64, 128, 256)
AT_ONCE = (2, 4)
THREADS = (128, 256)
BLOCKS = (4, 8, 16)


def configure(chunk: int, at_once: int, threads: int, blocks: int) -> None:
    """Set the constants and drop what was compiled or sized with the old ones."""
    cuda.CHUNK = cuda_kernels.CHUNK = chunk
    cuda_kernels.OCCURRENCES_AT_ONCE, cuda.THREADS_PER_BLOCK, cuda.BLOCKS_PER_MULTIPROCESSOR = at_once, threads, blocks
    cuda_kernels.compiled.cache_clear()
    cuda._WORKSPACES.clear()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--optimizer", default="rowwise_adagrad", choices=SPARSE_OPTIMIZERS.names())
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--batch", type=int, default=65_536)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    device = torch.device(args.device)

    ceiling = workload_of.copy_bandwidth(device, args.repeats)
    workload = workload_of.Workload(args.optimizer, args, device)
    in_torch_ops = workload_of.median_seconds(partial(workload.run, "reference"), device, 5)
    moved = workload_of.update_bytes(workload.config, workload.ids, args.dim)
    fused_step = partial(workload.run, "cuda")
    print(f"device copy {ceiling / 1e9:,.0f} GB/s; {args.optimizer} in torch ops {in_torch_ops * 1e3:.3f} ms")

    default = (
        cuda_kernels.CHUNK,
        cuda_kernels.OCCURRENCES_AT_ONCE,
        cuda.THREADS_PER_BLOCK,
        cuda.BLOCKS_PER_MULTIPROCESSOR,
    )
    combinations = [(*first, default[3]) for first in itertools.product(CHUNKS, AT_ONCE, THREADS)]
    combinations += [(*default[:3], blocks) for blocks in BLOCKS if blocks != default[3]]
    best: tuple[float, tuple[int, int, int, int]] | None = None
    for combination in combinations:
        configure(*combination)
        started = time.perf_counter()
        fused_step()
        workload_of.synchronize(device)
        compiled_in = time.perf_counter() - started
        fused = workload_of.median_seconds(fused_step, device, args.repeats, warmup=1)
        chunk, at_once, threads, blocks = combination
        print(
            f"chunk={chunk} at_once={at_once} threads={threads} blocks_per_sm={blocks} fused_ms={fused * 1e3:.3f} "
            f"ratio_vs_torch={in_torch_ops / fused:.2f} fraction_of_copy={moved / fused / ceiling:.2f} "
            f"compile_s={compiled_in:.1f}",
            flush=True,
        )
        if best is None or fused < best[0]:
            best = (fused, combination)
    assert best is not None
    print(f"best: chunk, at_once, threads, blocks_per_sm = {best[1]} (the defaults: {default})")
    configure(*best[1])
    if device.type == "cuda":
        workload_of.profile_step(workload, device)


if __name__ == "__main__":
    main()
