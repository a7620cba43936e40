"""A hash table's lookups on a GPU (``CudaHashIndex``) against the CPU index (``HashIndex``), in one run.

The workload of ``benchmarks/hash_table.py``: Zipf(1.1) ids spread over int64, batches of
4096 x 26 ids, an index of ``capacity = N + N // 100`` slots (eviction lru) pre-filled with the
ids of ranks 1..N, then warmed up until full, so that each new id evicts one. Both indexes see
the same batches, taking turns; the GPU's ids are on the device already (as a GPU step's are)
and its time ends when the device is done. Per batch: the training lookup (find every
occurrence, admit and insert the new ids), the same batch again in the next step (every id
resident: the find path alone), and an evaluation lookup (find only). The GPU's training
lookup is also split: its unique/find part against the one-thread insertion of the new ids.

    python benchmarks/hash_table_gpu.py [--sizes 1000000 10000000] [--batches 10] [--warmup 30]

The last line reads ``gpu_over_cpu_1M=X gpu_over_cpu_10M=Y`` (CPU time over GPU time of the
training lookup, medians: above 1 the GPU is faster).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".numba_cache"))

import numba
import numpy as np
import torch

from embedding.cuda_hash_index import CudaHashIndex
from embedding.eviction import EvictionConfig
from embedding.hash_index import HashIndex, HashPolicy
from hash_table import BATCH_IDS, TABLE, spread, zipf_batches


def timed(device: torch.device, action: Callable[..., object], *arguments: object) -> float:
    """Seconds of ``action(*arguments)``, the device's work included."""
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    action(*arguments)
    torch.cuda.synchronize(device)
    return time.perf_counter() - start


def run_size(size: int, batches: int, warmup: int, device: torch.device) -> float:
    capacity = size + size // 100
    keys = np.sort(spread(np.arange(1, size + 1, dtype=np.int64)))
    policy = HashPolicy(eviction=EvictionConfig("lru"))
    cpu, gpu = HashIndex(capacity, policy), CudaHashIndex(capacity, policy, device=device)
    for index in (cpu, gpu):
        index.load_keys(keys, np.zeros(size, dtype=np.int32), np.ones(size, dtype=np.int32), step=0)
        index.advance()
    stream = zipf_batches(seed=size)
    warm = 0
    while warm < warmup and cpu.num_used < capacity:
        ids = next(stream)
        cpu.touch_or_insert(ids, TABLE)
        gpu.look_up(torch.from_numpy(ids).to(device), True, TABLE)
        cpu.advance(), gpu.advance()
        warm += 1

    times: dict[str, list[float]] = {
        name: [] for name in ("cpu", "gpu", "cpu_again", "gpu_again", "cpu_eval", "gpu_eval")
    }
    insert_seconds, inserted = [], []
    for turn in range(batches):
        ids = next(stream)
        on_device = torch.from_numpy(ids).to(device)
        for suffix in ("", "_again"):
            for side in ("cpu", "gpu") if turn % 2 == 0 else ("gpu", "cpu"):
                if side == "cpu":
                    start = time.perf_counter()
                    cpu.touch_or_insert(ids, TABLE)
                    times["cpu" + suffix].append(time.perf_counter() - start)
                    cpu.advance()
                else:
                    times["gpu" + suffix].append(timed(device, gpu.look_up, on_device, True, TABLE))
                    gpu.advance()
        start = time.perf_counter()
        cpu.find(ids)
        times["cpu_eval"].append(time.perf_counter() - start)
        times["gpu_eval"].append(timed(device, gpu.look_up, on_device, False, TABLE))
        # The insertion alone, on the next batch's new ids (found by the CPU index first, untimed).
        ids = next(stream)
        missing = np.unique(ids[cpu.find(ids) < 0])
        counts = np.ones(missing.size, dtype=np.int64)
        insert_seconds.append(timed(device, gpu.find_or_insert, missing, counts, TABLE))
        cpu.find_or_insert(missing, counts, TABLE)
        inserted.append(missing.size)
        cpu.advance(), gpu.advance()
    assert np.array_equal(cpu.find(keys[:100_000]), gpu.find(keys[:100_000])), "the two indexes parted"

    median = {name: statistics.median(values) for name, values in times.items()}
    print(f"\n{size:,} resident ids, capacity {capacity:,}, {warm} warm-up batches, {batches} measured")
    print("| lookup | CPU ms | GPU ms | CPU / GPU |")
    print("| --- | ---: | ---: | ---: |")
    for name, label in (("", "training (find + insert)"), ("_again", "same batch again"), ("_eval", "evaluation")):
        cpu_ms, gpu_ms = median["cpu" + name] * 1e3, median["gpu" + name] * 1e3
        print(f"| {label} | {cpu_ms:.2f} | {gpu_ms:.2f} | {cpu_ms / gpu_ms:.2f} |")
    per_insert = statistics.median(s / max(n, 1) for s, n in zip(insert_seconds, inserted))
    print(
        f"GPU one-thread insertion: median {statistics.median(inserted):,.0f} new ids per batch, "
        f"{per_insert * 1e6:.2f} us per id"
    )
    return median["cpu"] / median["gpu"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=30)
    args = parser.parse_args()
    numba.set_num_threads(1)
    device = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name(device)}; CPU index on one thread; batches of {BATCH_IDS:,} ids")
    ratios = {size: run_size(size, args.batches, args.warmup, device) for size in args.sizes}
    print(" ".join(f"gpu_over_cpu_{size // 1_000_000}M={ratio:.2f}" for size, ratio in ratios.items()))


if __name__ == "__main__":
    main()
