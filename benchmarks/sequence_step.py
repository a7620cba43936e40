"""DIN's and SASRec's training steps through our stack against the same models in plain torch, in one run, taking
turns.

The batches are shaped like a real click log's (batch 2048, dim 32): a candidate item and the user's latest items
(at most 50), both Zipf(1.1) over a catalogue of 1,000,000 items, one table for both; most users have a full history
of 50, a quarter fewer (0 to 49, uniform); for DIN also a user id over 1,000,000 rows, three small categorical
features (1,000, 24 and 8 values) and two dense features, labels of a coin; for SASRec the candidate is the item
rated next (every row a positive). Several such batches are made once and every method steps through the same ones
in turn.

- ``ours``: the ``din`` or ``sasrec`` zoo model as ``build_zoo_model`` builds it over the sparse sharded tables (the
  item table ``pooling: none``, looked up by the candidate and the sequence), fed a ``CTRBatch`` whose sequence is
  jagged (``JaggedIds``: ids and row offsets, no padding); the tables stepped by the fused row-wise Adagrad
  (``SparseOptimizer``), the dense layers by ``torch.optim.Adam``. DIN's loss is binary cross-entropy, SASRec's the
  retrieval recipe's own train unit (``RetrievalTrainUnit``: in-batch softmax with ``log q`` correction).
- ``torch ...``: the same model written in plain torch as its user would (``benchmarks/sequence_step_torch.py``:
  ``nn.Embedding`` tables, the sequence padded to ``[B, 50]`` ids with a mask made when the batch is made, the same
  layers and the same loss). Its tables trained by ``nn.Embedding(sparse=True)`` with ``torch.optim.SparseAdam`` or
  with ``torch.optim.Adagrad`` (sparse gradients, the closest to ours), or, with ``--baselines Adam``, dense tables
  under ``torch.optim.Adam`` (every step updates every row); the dense layers always by Adam.

A step: forward, the loss (mean), backward, the optimizers' ``step`` and ``zero_grad``. In every round each method
runs ``--steps`` steps, in a new (seeded) order each round, so that the machine's load weighs on all alike; a
round's samples/s is its steps' rows over their time. ``ratio_vs_torch`` is ours over the fastest torch method,
taken per round, its median over the rounds (the first ``--warmup`` steps of each method are not timed).

    python benchmarks/sequence_step.py [--models din sasrec] [--rounds 15] [--steps 1] [--warmup 2] [--threads N]
        [--device cpu|cuda] [--baselines SparseAdam Adagrad Adam]

Without ``--threads``, torch and numba take the threads a training run would (``recipes.runtime.threads``: the
cores other work leaves free at start-up): on the 2-core machine beside another developer's tests, two threads
ran every method 3-5x slower than one, each parallel region waiting for the other work's time slice. A model's
last line reads ``<model>: ours=S torch=T (<fastest torch method>) ratio_vs_torch=R``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".numba_cache"))

import numba
import numpy as np
import torch
from torch import nn

from embedding import CombinedOptimizer, JaggedIds, SparseFeatures, SparseOptimizer
from gang import FakeGang
from recipes.runtime.host_memory import keep_freed_memory
from recipes.runtime.threads import use_threads
from recipes.training.sparse_tables import find_sparse_tables
from recsys.click.batch import CTRBatch
from recsys.models.embeddings import TableSpec
from recsys.retrieval.units import ItemCorpus, RetrievalTrainUnit
from recsys.zoo import ZOO_MODELS, ZooEmbeddingSection, build_zoo_model
from sequence_step_torch import (  # benchmarks/sequence_step_torch.py: the batch's shape, the plain-torch models
    ATTENTION_DIMS,
    BATCH,
    DIM,
    DROPOUT,
    HIDDEN_DIMS,
    MAX_LEN,
    NUM_BLOCKS,
    NUM_DENSE,
    NUM_HEADS,
    NUM_ITEMS,
    NUM_USERS,
    SASREC_DROPOUT,
    SMALL,
    TEMPERATURE,
    PaddedBatch,
    TorchDIN,
    TorchSASRec,
)
from units import MetricBag

FULL_HISTORY = 0.75
"""The share of users whose history has the most ids a row keeps; the others have 0 to ``MAX_LEN - 1``."""
ZIPF = 1.1
DIN_TABLES = [
    TableSpec("user", NUM_USERS, ("user",)),
    TableSpec("item", NUM_ITEMS, ("item", "history"), "none"),
    *(TableSpec(name, rows, (name,)) for name, rows in SMALL.items()),
]
DIN_FEATURES = ["user", "item", "history", *SMALL]
SASREC_TABLES = [TableSpec("item", NUM_ITEMS, ("item", "history"), "none")]
SASREC_FEATURES = ["item", "history"]


@dataclass(frozen=True)
class Rows:
    """A batch's values: one id a row for the single-valued features, the histories one after the other."""

    single: dict[str, np.ndarray]
    history: np.ndarray
    lengths: np.ndarray
    dense: np.ndarray
    labels: np.ndarray

    @classmethod
    def make(cls, rng: np.random.Generator) -> Rows:
        def items(size: int) -> np.ndarray:
            return (rng.zipf(ZIPF, size) - 1) % NUM_ITEMS

        lengths = np.where(rng.random(BATCH) < FULL_HISTORY, MAX_LEN, rng.integers(0, MAX_LEN, BATCH))
        single = {"user": rng.integers(0, NUM_USERS, BATCH), "item": items(BATCH)}
        single |= {name: rng.integers(0, rows, BATCH) for name, rows in SMALL.items()}
        dense = rng.standard_normal((BATCH, NUM_DENSE)).astype(np.float32)
        labels = rng.integers(0, 2, BATCH).astype(np.float32)
        return cls(single, items(int(lengths.sum())), lengths, dense, labels)

    def next_item(self) -> Rows:
        """The rows as SASRec's: the history and the item that comes next (every row a positive), nothing else."""
        ones = np.ones(BATCH, dtype=np.float32)
        return Rows({"item": self.single["item"]}, self.history, self.lengths, self.dense[:, :0], ones)

    def jagged(self, device: torch.device) -> CTRBatch:
        """As our readers give it: every feature's ids with row offsets, the sequence unpadded."""
        offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(self.lengths)]))
        sparse = {name: JaggedIds.from_dense(torch.from_numpy(ids)[:, None]) for name, ids in self.single.items()}
        sparse["history"] = JaggedIds(torch.from_numpy(self.history), offsets)
        batch = CTRBatch(torch.from_numpy(self.dense), SparseFeatures(sparse), torch.from_numpy(self.labels))
        return batch.to(device)

    def padded(self, device: torch.device) -> PaddedBatch:
        """As a padded data set gives it: the histories ``[B, MAX_LEN]`` (each id + 1, 0 where a row has none)
        with their mask."""
        mask = np.arange(MAX_LEN)[None, :] < self.lengths[:, None]
        history = np.zeros((BATCH, MAX_LEN), dtype=np.int64)
        history[mask] = self.history + 1
        single = {name: torch.from_numpy(ids).to(device) for name, ids in self.single.items()}
        arrays = (history, mask, self.lengths, self.dense, self.labels)
        return PaddedBatch(single, *(torch.from_numpy(array).to(device) for array in arrays))


def item_shares(rows: list[Rows]) -> tuple[np.ndarray, np.ndarray]:
    """Every candidate item of the batches (sorted, unique) and its share of their rows."""
    ids, counts = np.unique(np.concatenate([r.single["item"] for r in rows]), return_counts=True)
    return ids, counts / counts.sum()


Step = Callable[[], None]
Loss = Callable[[Any], torch.Tensor]


def ours_din(rows: list[Rows], device: torch.device) -> Step:
    config = ZOO_MODELS.get("din").config_class(
        name="din",
        embeddings=ZooEmbeddingSection(dim=DIM),
        hidden_dims=HIDDEN_DIMS,
        attention_dims=ATTENTION_DIMS,
        dropout=DROPOUT,
    )
    model = build_zoo_model(
        config, DIN_TABLES, DIN_FEATURES, NUM_DENSE, FakeGang(device), 0, sequence_lengths={"history": MAX_LEN}
    )

    def loss(batch: CTRBatch) -> torch.Tensor:
        return nn.functional.binary_cross_entropy_with_logits(model(batch), batch.labels)

    return training_step(model, loss, ours_optimizer(model), [r.jagged(device) for r in rows])


def ours_sasrec(rows: list[Rows], device: torch.device) -> Step:
    config = ZOO_MODELS.get("sasrec").config_class(
        name="sasrec",
        embeddings=ZooEmbeddingSection(dim=DIM),
        item_feature="item",
        num_blocks=NUM_BLOCKS,
        num_heads=NUM_HEADS,
        dropout=SASREC_DROPOUT,
        temperature=TEMPERATURE,
    )
    gang = FakeGang(device)
    model = build_zoo_model(config, SASREC_TABLES, SASREC_FEATURES, 0, gang, 0, sequence_lengths={"history": MAX_LEN})
    ids, shares = item_shares(rows)
    corpus = ItemCorpus(torch.from_numpy(ids).to(device), torch.from_numpy(shares).to(device))
    unit = RetrievalTrainUnit(model, MetricBag(gang), device, corpus)

    def loss(batch: CTRBatch) -> torch.Tensor:
        return unit(batch).mean()

    return training_step(model, loss, ours_optimizer(model), [r.jagged(device) for r in rows])


def ours_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    """The dense layers under Adam, the sparse tables under the fused row-wise Adagrad, as a training run's."""
    sparse = SparseOptimizer(list(find_sparse_tables(model).values()))
    return CombinedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-3), sparse)


def torch_model(name: str, sparse: bool, rows: list[Rows]) -> TorchDIN | TorchSASRec:
    if name == "din":
        return TorchDIN(sparse)
    ids, shares = item_shares(rows)
    log_shares = torch.full((NUM_ITEMS,), float(np.log(shares.min())))
    log_shares[torch.from_numpy(ids)] = torch.from_numpy(np.log(shares)).float()
    return TorchSASRec(sparse, log_shares)


def torch_baseline(name: str, table_optimizer: str) -> Callable[[list[Rows], torch.device], Step]:
    def build(rows: list[Rows], device: torch.device) -> Step:
        model = torch_model(name, table_optimizer != "Adam", rows).to(device)
        sparse = [m for m in model.modules() if isinstance(m, nn.Embedding) and m.sparse]  # Not SASRec's positions.
        tables = [p for module in sparse for p in module.parameters()]
        dense = [p for p in model.parameters() if all(p is not table for table in tables)]
        if table_optimizer == "Adam":
            optimizer: torch.optim.Optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        else:
            for_tables = (
                torch.optim.SparseAdam(tables, lr=1e-3)
                if table_optimizer == "SparseAdam"
                else torch.optim.Adagrad(tables, lr=0.05)
            )
            optimizer = Both(torch.optim.Adam(dense, lr=1e-3), for_tables)
        return training_step(model, model.loss, optimizer, [r.padded(device) for r in rows])

    return build


class Both(torch.optim.Optimizer):
    """Two torch optimizers stepped as one."""

    def __init__(self, first: torch.optim.Optimizer, second: torch.optim.Optimizer) -> None:
        self.optimizers = (first, second)

    def step(self, closure: None = None) -> None:  # type: ignore[override]
        for optimizer in self.optimizers:
            optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none)


def training_step(model: nn.Module, loss: Loss, optimizer: torch.optim.Optimizer, batches: list[Any]) -> Step:
    """One step a call, on the next of ``batches`` in turn."""
    model.train()
    turn = iter(range(sys.maxsize))

    def step() -> None:
        loss(batches[next(turn) % len(batches)]).backward()
        optimizer.step()
        optimizer.zero_grad()

    return step


OURS = {"din": ours_din, "sasrec": ours_sasrec}
BASELINES = {
    "SparseAdam": "torch Embedding(sparse) + SparseAdam",
    "Adagrad": "torch Embedding(sparse) + Adagrad",
    "Adam": "torch Embedding + Adam",
}


def rates_by_round(steps: dict[str, Step], args: argparse.Namespace, device: torch.device) -> dict[str, list[float]]:
    """Samples/s of each method in each round, the methods in a new (seeded) order every round."""
    for step in steps.values():
        for _ in range(args.warmup):
            step()
    rates: dict[str, list[float]] = {name: [] for name in steps}
    order, shuffler = list(steps), random.Random(0)
    for _ in range(args.rounds):
        shuffler.shuffle(order)
        for name in order:
            synchronize(device)
            start = time.perf_counter()
            for _ in range(args.steps):
                steps[name]()
            synchronize(device)
            rates[name].append(args.steps * BATCH / (time.perf_counter() - start))
    return rates


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=list(OURS), default=list(OURS))
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=1, help="steps of each method in a round")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batches", type=int, default=4, help="distinct batches the steps go through in turn")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch's and numba's (default: as training chooses, the free cores)"
    )
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument(
        "--baselines",
        nargs="+",
        choices=list(BASELINES),
        default=["SparseAdam", "Adagrad"],
        help="how the torch models train their tables (Adam: dense tables, every row updated at every step)",
    )
    args = parser.parse_args()
    threads_line = use_threads(args.threads)  # as training chooses them
    memory_line = keep_freed_memory()  # as training runs the step
    device = torch.device(args.device)
    warnings.filterwarnings("ignore", message="Sparse invariant checks")  # torch's Adagrad, at every step

    print(f"command: {' '.join([sys.executable, *sys.argv])}")
    print(threads_line.replace("gang.threads_per_rank", "--threads"))
    print(memory_line)
    rng = np.random.default_rng(0)
    rows = [Rows.make(rng) for _ in range(args.batches)]
    mean_length = statistics.mean(float(r.lengths.mean()) for r in rows)
    print(
        f"batch {BATCH}, dim {DIM}, history of at most {MAX_LEN} items (mean {mean_length:.1f}), items "
        f"Zipf({ZIPF}) over {NUM_ITEMS:,}; {args.rounds} rounds of {args.steps} steps per method after "
        f"{args.warmup} warm-up, device {device}"
    )
    print(f"threads: torch {torch.get_num_threads()}, numba {numba.get_num_threads()} ({numba.threading_layer()})")
    for model in args.models:
        model_rows = rows if model == "din" else [r.next_item() for r in rows]
        compare(model, model_rows, args, device)


def compare(model: str, rows: list[Rows], args: argparse.Namespace, device: torch.device) -> None:
    """Time ``model``'s steps, ours and the baselines', and print the table and the ratio."""
    torch.manual_seed(0)
    ours = f"ours ({model}, row-wise Adagrad)"
    steps = {ours: OURS[model](rows, device)}
    steps |= {BASELINES[name]: torch_baseline(model, name)(rows, device) for name in args.baselines}
    rates = rates_by_round(steps, args, device)

    print(f"\n{model}:\n\n| method | median samples/s | IQR |")
    print("| --- | ---: | ---: |")
    for name, method_rates in rates.items():
        low, _, high = statistics.quantiles(method_rates, n=4) if len(method_rates) > 1 else method_rates * 3
        print(f"| {name} | {statistics.median(method_rates):,.0f} | {low:,.0f}-{high:,.0f} |")
    fastest = max((name for name in rates if name.startswith("torch")), key=lambda name: statistics.median(rates[name]))
    ratios = [ours_rate / torch_rate for ours_rate, torch_rate in zip(rates[ours], rates[fastest], strict=True)]
    print(f"\nper-round ratios, ours / {fastest}: {', '.join(f'{r:.2f}' for r in ratios)}")
    print(
        f"{model}: ours={statistics.median(rates[ours]):.0f} torch={statistics.median(rates[fastest]):.0f} "
        f"({fastest}) ratio_vs_torch={statistics.median(ratios):.2f}"
    )


if __name__ == "__main__":
    main()
