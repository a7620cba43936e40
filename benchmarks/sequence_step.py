"""DIN training steps through our stack against the same model in plain torch, in one run, taking turns.

The batch is shaped like a real click log's (batch 2048, dim 32): a candidate item and the user's latest items (at
most 50), both Zipf(1.1) over a catalogue of 1,000,000 items, one table for both; most users have a full history of
50, a quarter fewer (0 to 49, uniform); a user id over 1,000,000 rows, three small categorical features (1,000, 24
and 8 values) and two dense features; labels of a coin. Several such batches are made once and every method steps
through the same ones in turn.

- ``ours``: the ``din`` zoo model as ``build_zoo_model`` builds it over the sparse sharded tables (the item table
  ``pooling: none``, looked up by the candidate and the sequence), fed a ``CTRBatch`` whose sequence is jagged
  (``JaggedIds``: ids and row offsets, no padding); the tables stepped by the fused row-wise Adagrad
  (``SparseOptimizer``), the dense layers by ``torch.optim.Adam``.
- ``torch ...``: the same model written in plain torch as its user would: ``nn.Embedding`` tables, the sequence
  padded to ``[B, 50]`` ids with a mask (made when the batch is made, as a padded data set gives them), the same
  activation unit (the MLP over ``[item, candidate, item - candidate, item * candidate]`` at every position, the
  scaled softmax over the mask) and the same deep MLP with dropout. Its tables trained by
  ``nn.Embedding(sparse=True)`` with ``torch.optim.SparseAdam`` or with ``torch.optim.Adagrad`` (sparse gradients,
  the closest to ours; the faster of the two here), or, with ``--baselines Adam``, dense tables under
  ``torch.optim.Adam`` (about half Adagrad's samples/s: every step updates all 2 million rows); the dense layers
  always by Adam.

A step: forward, binary cross-entropy (mean), backward, the optimizers' ``step`` and ``zero_grad``. In every round
each method runs ``--steps`` steps, in a new (seeded) order each round, so that the machine's load weighs on all
alike; a round's samples/s is its steps' rows over their time. ``ratio_vs_torch`` is ours over the fastest torch
method, taken per round, its median over the rounds (the first ``--warmup`` steps of each method are not timed).

    python benchmarks/sequence_step.py [--rounds 15] [--steps 1] [--warmup 2] [--threads N] [--device cpu|cuda]
        [--baselines SparseAdam Adagrad Adam]

Without ``--threads``, torch and numba take the threads a training run would (``recipes.runtime.threads``: the
cores other work leaves free at start-up): on the 2-core machine beside another developer's tests, two threads
ran every method 3-5x slower than one, each parallel region waiting for the other work's time slice. The last
line reads ``ours=S torch=T (<fastest torch method>) ratio_vs_torch=R``.
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
from recsys.zoo import ZOO_MODELS, ZooEmbeddingSection, build_zoo_model

BATCH, MAX_LEN, DIM = 2048, 50, 32
NUM_ITEMS, NUM_USERS = 1_000_000, 1_000_000
SMALL = {"category": 1000, "hour": 24, "device": 8}
NUM_DENSE = 2
FULL_HISTORY = 0.75
"""The share of users whose history has the most ids a row keeps; the others have 0 to ``MAX_LEN - 1``."""
ZIPF = 1.1
ATTENTION_DIMS, HIDDEN_DIMS, DROPOUT = [80, 40], [200, 80], 0.2
"""The zoo's ``din`` defaults (the paper's), which the torch model copies."""
TABLES = [
    TableSpec("user", NUM_USERS, ("user",)),
    TableSpec("item", NUM_ITEMS, ("item", "history"), "none"),
    *(TableSpec(name, rows, (name,)) for name, rows in SMALL.items()),
]
FEATURES = ["user", "item", "history", *SMALL]


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
        return PaddedBatch(
            single,
            torch.from_numpy(history).to(device),
            torch.from_numpy(mask).to(device),
            torch.from_numpy(self.dense).to(device),
            torch.from_numpy(self.labels).to(device),
        )


@dataclass(frozen=True)
class PaddedBatch:
    single: dict[str, torch.Tensor]
    history: torch.Tensor
    mask: torch.Tensor
    dense: torch.Tensor
    labels: torch.Tensor


def mlp(in_dim: int, hidden_dims: list[int], activation: Callable[[], nn.Module], dropout: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    for hidden in hidden_dims:
        layers += [nn.Linear(in_dim, hidden), activation()] + ([nn.Dropout(dropout)] if dropout else [])
        in_dim = hidden
    return nn.Sequential(*layers, nn.Linear(in_dim, 1))


class TorchDIN(nn.Module):
    """DIN as a plain-torch user writes it, over padded sequences (item row 0 is the padding, ``padding_idx``: the
    padded positions add no row to the sparse gradient)."""

    def __init__(self, sparse: bool) -> None:
        super().__init__()
        rows = {"user": NUM_USERS, "item": NUM_ITEMS + 1, **SMALL}
        self.tables = nn.ModuleDict(
            {
                name: nn.Embedding(num, DIM, sparse=sparse, padding_idx=0 if name == "item" else None)
                for name, num in rows.items()
            }
        )
        for table in self.tables.values():
            nn.init.uniform_(table.weight, -0.05, 0.05)  # The padding row too, which attention masks.
        self.attention = mlp(4 * DIM, ATTENTION_DIMS, nn.Sigmoid, 0.0)
        self.mlp = mlp(NUM_DENSE + DIM * (len(rows) + 1), HIDDEN_DIMS, nn.ReLU, DROPOUT)

    def forward(self, batch: PaddedBatch) -> torch.Tensor:
        vectors = {name: self.tables[name](ids) for name, ids in batch.single.items() if name != "item"}
        candidate = self.tables["item"](batch.single["item"] + 1)
        items = self.tables["item"](batch.history)
        expanded = candidate.unsqueeze(1).expand_as(items)
        units = torch.cat([items, expanded, items - expanded, items * expanded], dim=-1)
        scores = (self.attention(units).squeeze(-1) / DIM**0.5).masked_fill(~batch.mask, float("-inf"))
        weights = torch.softmax(scores, dim=1).nan_to_num(0.0)
        interest = torch.einsum("bl,bld->bd", weights, items)
        parts = [batch.dense, vectors["user"], candidate, interest, *(vectors[name] for name in SMALL)]
        return self.mlp(torch.cat(parts, dim=1)).squeeze(1)


Step = Callable[[], None]


def ours(rows: list[Rows], device: torch.device) -> Step:
    config = ZOO_MODELS.get("din").config_class(
        name="din",
        embeddings=ZooEmbeddingSection(dim=DIM),
        hidden_dims=HIDDEN_DIMS,
        attention_dims=ATTENTION_DIMS,
        dropout=DROPOUT,
    )
    model = build_zoo_model(
        config, TABLES, FEATURES, NUM_DENSE, FakeGang(device), 0, sequence_lengths={"history": MAX_LEN}
    )
    optimizer = CombinedOptimizer(
        torch.optim.Adam(model.parameters(), lr=1e-3), SparseOptimizer(list(find_sparse_tables(model).values()))
    )
    return training_step(model, optimizer, [r.jagged(device) for r in rows])


def torch_baseline(table_optimizer: str) -> Callable[[list[Rows], torch.device], Step]:
    def build(rows: list[Rows], device: torch.device) -> Step:
        model = TorchDIN(sparse=table_optimizer != "Adam").to(device)
        tables = list(model.tables.parameters())
        dense = [p for name, p in model.named_parameters() if not name.startswith("tables.")]
        if table_optimizer == "Adam":
            optimizer: torch.optim.Optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        else:
            sparse = (
                torch.optim.SparseAdam(tables, lr=1e-3)
                if table_optimizer == "SparseAdam"
                else torch.optim.Adagrad(tables, lr=0.05)
            )
            optimizer = Both(torch.optim.Adam(dense, lr=1e-3), sparse)
        return training_step(model, optimizer, [r.padded(device) for r in rows])

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


def training_step(model: nn.Module, optimizer: torch.optim.Optimizer, batches: list) -> Step:  # type: ignore[type-arg]
    """One step a call, on the next of ``batches`` in turn."""
    model.train()
    turn = iter(range(sys.maxsize))

    def step() -> None:
        batch = batches[next(turn) % len(batches)]
        loss = nn.functional.binary_cross_entropy_with_logits(model(batch), batch.labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    return step


OURS = "ours (din, row-wise Adagrad)"
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
        help="how the torch model trains its tables (Adam: dense tables, at about half Adagrad's samples/s)",
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
    torch.manual_seed(0)
    steps = {OURS: ours(rows, device)}
    steps |= {BASELINES[name]: torch_baseline(name)(rows, device) for name in args.baselines}
    print(f"threads: torch {torch.get_num_threads()}, numba {numba.get_num_threads()} ({numba.threading_layer()})\n")
    rates = rates_by_round(steps, args, device)

    print("| method | median samples/s | IQR |")
    print("| --- | ---: | ---: |")
    for name, method_rates in rates.items():
        low, _, high = statistics.quantiles(method_rates, n=4) if len(method_rates) > 1 else method_rates * 3
        print(f"| {name} | {statistics.median(method_rates):,.0f} | {low:,.0f}-{high:,.0f} |")
    fastest = max((name for name in rates if name.startswith("torch")), key=lambda name: statistics.median(rates[name]))
    ratios = [ours_rate / torch_rate for ours_rate, torch_rate in zip(rates[OURS], rates[fastest], strict=True)]
    print(f"\nper-round ratios, ours / {fastest}: {', '.join(f'{r:.2f}' for r in ratios)}")
    print(
        f"ours={statistics.median(rates[OURS]):.0f} torch={statistics.median(rates[fastest]):.0f} ({fastest}) "
        f"ratio_vs_torch={statistics.median(ratios):.2f}"
    )


if __name__ == "__main__":
    main()
