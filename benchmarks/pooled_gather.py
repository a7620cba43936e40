"""Does a pooled gather in numba beat ``F.embedding_bag`` for the sparse step's forward? (issue 17)

The lookup of ``benchmarks/sparse_step.py``: 4096 samples x 26 features, Zipf ids (numpy zipf a=1.1, fixed seed)
over one 1,000,000 x 64 float32 table, summed per bag; bags of 1 id (Criteo) and of 3; and uniform ids, 1 a bag
(every row cold). Both methods allocate
their output at every call, as the forward must. The numba kernel takes bags in parallel (``prange``), summing
each bag's rows in order, so its result equals ``embedding_bag``'s bit for bit (checked). Rounds alternate
blocks of calls of each method (a block, not call by call, so that neither runs while the other's threads
still spin); the table gives the median over the rounds of each block's mean, and the fastest block.

    python benchmarks/pooled_gather.py [--threads 2] [--rounds 9] [--calls 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from functools import partial


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    os.environ["NUMBA_NUM_THREADS"] = str(args.threads)  # before numba starts its pool

    import numba
    import numpy as np
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)

    @numba.njit(parallel=True)
    def pooled_sum(weight, ids, offsets):  # type: ignore[no-untyped-def]
        out = np.empty((len(offsets) - 1, weight.shape[1]), weight.dtype)
        for bag in numba.prange(len(offsets) - 1):
            for d in range(weight.shape[1]):
                out[bag, d] = 0.0
            for k in range(offsets[bag], offsets[bag + 1]):
                row = ids[k]
                for d in range(weight.shape[1]):
                    out[bag, d] += weight[row, d]
        return out

    rng = np.random.default_rng(0)
    weight = torch.randn(1_000_000, 64)
    print(f"{args.threads} threads, {args.rounds} rounds of {args.calls} calls per method")
    print("| ids | ids per bag | embedding_bag ms | numba ms | fastest blocks (ms) | numba / embedding_bag |")
    print("| --- | ---: | ---: | ---: | --- | ---: |")
    for spread, ids_per_bag in (("zipf", 1), ("zipf", 3), ("uniform", 1)):
        num_ids = 4096 * 26 * ids_per_bag
        drawn = rng.zipf(1.1, num_ids) - 1 if spread == "zipf" else rng.integers(0, 1_000_000, num_ids)
        ids = torch.from_numpy(drawn % 1_000_000)
        offsets = torch.arange(0, ids.numel() + 1, ids_per_bag)
        methods: dict[str, Callable[[], object]] = {
            "embedding_bag": partial(F.embedding_bag, ids, weight, offsets, mode="sum", include_last_offset=True),
            "numba": partial(pooled_sum, weight.numpy(), ids.numpy(), offsets.numpy()),
        }
        expected = F.embedding_bag(ids, weight, offsets, mode="sum", include_last_offset=True)
        assert torch.equal(torch.from_numpy(methods["numba"]()), expected), "the kernel's sums differ"  # type: ignore[arg-type]
        blocks: dict[str, list[float]] = {name: [] for name in methods}
        for _ in range(args.rounds):
            for name, method in methods.items():
                start = time.perf_counter()
                for _ in range(args.calls):
                    method()
                blocks[name].append((time.perf_counter() - start) / args.calls * 1e3)
        torch_ms, numba_ms = (statistics.median(blocks[name]) for name in methods)
        fastest = f"{min(blocks['embedding_bag']):.2f} / {min(blocks['numba']):.2f}"
        print(f"| {spread} | {ids_per_bag} | {torch_ms:.2f} | {numba_ms:.2f} | {fastest} | {numba_ms / torch_ms:.2f} |")


if __name__ == "__main__":
    main()
