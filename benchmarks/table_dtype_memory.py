"""What half-precision tables save in a training process: its peak resident memory with float32 and float16 rows.

Issue 51's memory line: a training run with float16 tables should take about half the float32 run's table bytes.
Each dtype runs in a process of its own: it records its peak resident memory (``VmHWM``) before the tables exist,
builds 26 tables of ``--rows`` x 64 with row-wise Adagrad (one float32 of state a row, whatever the rows' dtype),
trains ``--steps`` steps of 4096 x 26 Zipf(1.1) ids (``sparse_step.py``'s batch), and records its peak again. The
growth is what the tables and their training took; the start-up report's expected bytes are printed beside it.

    python benchmarks/table_dtype_memory.py [--rows 200000] [--steps 20]

The last line reads ``fp16_fraction=F``: the float16 run's growth over the float32 run's (goal: about 0.5).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys

os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".numba_cache"))

import numpy as np
import torch

from embedding import EmbeddingTableConfig, JaggedIds, ShardedEmbeddingCollection, SparseFeatures, SparseOptimizer
from embedding.optimizers import sparse_optimizer_config

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sparse_step import BATCH, FEATURES
from tiered_tables import peak_rss_bytes

DIM = 64


def grow(dtype: str, rows: int, steps: int) -> tuple[int, int]:
    """In this process: the peak resident memory's growth over building and training the tables, and the table
    bytes the collection expects (rows and optimizer state)."""
    before = peak_rss_bytes()
    tables = [EmbeddingTableConfig(f"t{i}", rows, DIM, (name,), dtype=dtype) for i, name in enumerate(FEATURES)]  # type: ignore[arg-type]
    collection = ShardedEmbeddingCollection(tables, seed=0, optimizer=sparse_optimizer_config("rowwise_adagrad"))
    optimizer = SparseOptimizer(collection)
    for step in range(steps):
        ranks = np.random.default_rng(step).zipf(1.1, size=(len(FEATURES), BATCH)) % rows
        features = SparseFeatures(
            {name: JaggedIds.from_dense(torch.from_numpy(ranks[i]).view(BATCH, 1)) for i, name in enumerate(FEATURES)}
        )
        outputs = collection(features)
        torch.stack([pooled.sum(1) for pooled in outputs.values()]).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    expected = sum(need.near for need in collection.tier_needs)
    return peak_rss_bytes() - before, expected


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    growth = {}
    with multiprocessing.get_context("spawn").Pool(1, maxtasksperchild=1) as pool:
        for dtype in ("float32", "float16"):
            growth[dtype], expected = pool.apply(grow, (dtype, args.rows, args.steps))
            print(
                f"{dtype}: peak RSS grew {growth[dtype] / 2**20:,.0f} MiB; tables expected {expected / 2**20:,.0f} MiB"
            )
    print(f"fp16_fraction={growth['float16'] / growth['float32']:.2f}")


if __name__ == "__main__":
    main()
