"""The train pipeline against the plain loop: whole runs, and the share of the id exchange it hides.

Part 1, whole runs: ``python -m recipes train PRESET`` on 1 and 2 processes of this machine, with
``trainer.pipeline`` true and false, every table row-wise (so that every id travels to its owner on
2 ranks), the same global batch. The rate is the run's own ``throughput`` metric (samples/s over each
publishing window, the first one skipped), median over windows; the four configurations take turns
for ``--rounds`` rounds and the table gives medians over rounds.

Part 2, the exchange: 2 spawned gloo processes, 1 thread each, step a collection of 26 row-wise tables
(``--rows`` rows of dim 64 in all, rowwise Adagrad) on Zipf ids, ``--batch`` samples per rank, behind
a small MLP. Three loops take turns step by step: the plain step (lookup, MLP, backward, update); the
pipelined step (the next step's ids grouped and sent on a background thread and a second process
group, as ``PipelinedReader`` does, while this step computes); and the id exchange alone
(``ShardedEmbeddingCollection.prepare_ahead`` of a step's ids). The share of the exchange hidden is
``(plain - pipelined) / exchange``, from medians.

    python benchmarks/pipeline.py [--preset dlrm_criteo_tiny] [--steps 100] [--batch-size 2048] [--rounds 3]
                                  [--batch 2048] [--rows 1000000] [--micro-steps 60]

The last line reads ``ratio_1=A ratio_2=B hidden=C`` (pipelined over plain samples/s on 1 and 2
processes, and the share hidden).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numba
import numpy as np
import torch
import torch.distributed as dist
from torch.multiprocessing.spawn import spawn

from embedding import EmbeddingTableConfig, JaggedIds, ShardedEmbeddingCollection, SparseFeatures, SparseOptimizer
from embedding.optimizers.rowwise_adagrad import RowwiseAdagradConfig
from gang import ProcessGroupGang

NUM_FEATURES = 26
DIM = 64


def samples_per_second(preset: str, nproc: int, pipeline: bool, steps: int, batch_size: int, output_dir: Path) -> float:
    command = [sys.executable, "-m", "recipes", "train", preset, "-o", str(output_dir), "--nproc", str(nproc)]
    command += [
        f"trainer.max_num_steps={steps}",
        f"trainer.pipeline={str(pipeline).lower()}",
        "trainer.validate_every_n_steps=null",
        "trainer.publish_metrics_every_n_steps=20",
        f"dataset.batch_size={batch_size}",
        "model.embeddings.placement=row_wise",
        "checkpoint.every_n_steps=null",
        "metrics.recorders.console=false",
        "metrics.recorders.tensorboard=false",
    ]
    subprocess.run(command, check=True, capture_output=True)
    lines = (output_dir / "metrics" / "train.jsonl").read_text().splitlines()
    return float(statistics.median(float(json.loads(line)["throughput"]) for line in lines[1:]))


def whole_runs(args: argparse.Namespace) -> dict[int, float]:
    rates: dict[tuple[int, bool], list[float]] = {(n, p): [] for n in (1, 2) for p in (True, False)}
    with tempfile.TemporaryDirectory() as folder:
        for round_nr in range(args.rounds):
            for nproc, pipeline in rates:
                output_dir = Path(folder) / f"run_{nproc}_{pipeline}_{round_nr}"
                rate = samples_per_second(args.preset, nproc, pipeline, args.steps, args.batch_size, output_dir)
                rates[nproc, pipeline].append(rate)
    print(f"{args.preset}, global batch {args.batch_size}, {args.steps} steps, row-wise tables, {os.cpu_count()} cores")
    print("| processes | pipeline | median samples/s | rounds |")
    print("| ---: | --- | ---: | --- |")
    for (nproc, pipeline), values in rates.items():
        print(f"| {nproc} | {pipeline} | {statistics.median(values):.0f} | {', '.join(f'{v:.0f}' for v in values)} |")
    return {n: statistics.median(rates[n, True]) / statistics.median(rates[n, False]) for n in (1, 2)}


def zipf_features(generator: np.random.Generator, batch: int, rows_per_table: int) -> SparseFeatures:
    offsets = torch.arange(batch + 1)
    features = {}
    for index in range(NUM_FEATURES):
        ids = np.minimum(generator.zipf(1.1, batch) - 1, rows_per_table - 1)
        features[f"f{index}"] = JaggedIds(torch.from_numpy(ids.astype(np.int64)), offsets)
    return SparseFeatures(features)


def exchange_worker(rank: int, port: int, args: argparse.Namespace, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    numba.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    assert dist.group.WORLD is not None
    gang = ProcessGroupGang(dist.group.WORLD, torch.device("cpu"))
    id_gang = gang.make_gang([0, 1])
    assert id_gang is not None
    rows = args.rows // NUM_FEATURES
    tables = [EmbeddingTableConfig(f"t{i}", rows, DIM, (f"f{i}",), placement="row_wise") for i in range(NUM_FEATURES)]
    collection = ShardedEmbeddingCollection(tables, gang, optimizer=RowwiseAdagradConfig())
    optimizer = SparseOptimizer(collection)
    mlp = torch.nn.Sequential(torch.nn.Linear(NUM_FEATURES * DIM, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
    generator = np.random.default_rng(rank)
    batches = [zipf_features(generator, args.batch, rows) for _ in range(8)]

    def step(features: SparseFeatures) -> None:
        outputs = collection(features)
        mlp(torch.cat([outputs[f"f{i}"] for i in range(NUM_FEATURES)], dim=1)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()

    prepared = [collection.prepare_ahead(batches[0], id_gang)]

    def pipelined(upcoming: SparseFeatures) -> None:
        sender = threading.Thread(target=lambda: prepared.append(collection.prepare_ahead(upcoming, id_gang)))
        sender.start()
        step(prepared.pop(0))  # takes what the step before sent ahead
        sender.join()

    times: dict[str, list[float]] = {"plain": [], "pipelined": [], "exchange": []}
    for features in batches[:3]:  # warm-up: numba's compilation, first allocations
        step(features)
    for nr in range(args.micro_steps):
        other = batches[(nr + 4) % 8]  # neither this step's batch nor the one sent ahead
        runs: tuple[tuple[str, Callable[[], object]], ...] = (
            ("pipelined", partial(pipelined, batches[(nr + 1) % 8])),
            ("plain", partial(step, other)),
            ("exchange", partial(collection.prepare_ahead, other, id_gang)),
        )
        for name, run in runs:
            gang.barrier()
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    if rank == 0:
        Path(out).write_text(json.dumps({name: statistics.median(values[3:]) for name, values in times.items()}))
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


def exchange_share(args: argparse.Namespace) -> float:
    with socket.socket() as sock, tempfile.TemporaryDirectory() as folder:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()
        out = str(Path(folder) / "times.json")
        spawn(exchange_worker, args=(port, args, out), nprocs=2)
        medians = json.loads(Path(out).read_text())
    plain, pipelined, exchange = medians["plain"], medians["pipelined"], medians["exchange"]
    hidden = (plain - pipelined) / exchange
    print(f"\n2 ranks x 1 thread, 26 row-wise tables ({args.rows} rows x {DIM}), {args.batch} samples per rank:")
    print(
        f"plain step {plain * 1e3:.2f} ms, pipelined {pipelined * 1e3:.2f} ms, "
        f"id exchange alone {exchange * 1e3:.2f} ms"
    )
    print(f"share of the exchange hidden: {hidden:.2f}")
    return hidden


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="dlrm_criteo_tiny")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=2048, help="global batch of the whole runs")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=2048, help="samples per rank in part 2")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--micro-steps", type=int, default=60)
    args = parser.parse_args()
    ratios = whole_runs(args)
    hidden = exchange_share(args)
    print(f"ratio_1={ratios[1]:.2f} ratio_2={ratios[2]:.2f} hidden={hidden:.2f}")


if __name__ == "__main__":
    main()
