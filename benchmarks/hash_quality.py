"""Does a hash table of C rows reach the AUC of a modulo-hashed fixed table of C rows on click logs with rare ids?

The data: a fixed, seeded generator of a Criteo-like click log (a 0/1 click label and categorical columns of
hashed 64-bit ids, rows in time order). Each of four columns draws its ids from a universe of K ids:

- popularity: the id of random rank r (a seeded permutation of 1..K) has weight r ** -s (Zipf-like), so a few
  ids take most rows and most distinct ids occur once or a few times;
- drift: 30% of the universe exists before the stream starts (born uniformly in [-2L, 0]), the rest is born
  uniformly over the stream; an id's popularity fades as exp(-age / f), its fade time f exponential of mean L
  (a fraction of the stream's length): new ids keep appearing and old ones fade, as users, ads and queries do;
- the stream is drawn in 100 time blocks; each block's ids are drawn from the popularity of its time;
- the id written to the log is splitmix64 of (column number << 40 | universe index): spread over int64, as
  hashed raw values are.

| column | K | s | L | effect std |
| --- | ---: | ---: | ---: | ---: |
| user | 1,000,000 | 1.0 | 0.3 | 0.6 |
| item | 1,000,000 | 1.1 | 0.5 | 0.6 |
| publisher | 200,000 | 1.2 | 2.0 | 0.4 |
| query | 2,000,000 | 1.0 | 0.3 | 0.4 |

The label is Bernoulli(sigmoid(-1.5 + sum of the row's per-id effects)), every id's effect drawn from
N(0, std) of its column whatever its popularity: rare ids carry as much signal per occurrence as frequent ones.
The first 400,000 rows train (one pass, in time order, batch 1024), the next 100,000 validate (later in time).

The model: one table of dim 16 per column, the four pooled rows concatenated through Linear(64, 64), ReLU,
Linear(64, 1); tables stepped by ``SparseOptimizer`` (rowwise Adagrad, lr 0.02), the MLP by Adam (lr 0.03), the
rows initialised uniform in +-0.01 in every arm. The two learning rates are the best of a grid for the
*baseline* (table lr in {0.01, 0.02, 0.05, 0.1} x dense lr in {0.003, 0.01, 0.03}, seed 0; the hash arm's best
in that grid was 0.0005 above its figure here). The arms, on the same rows with the same seeds:

- ``fixed_modulo``: a fixed table of C rows per column, each id read at row ``id mod C`` (``out_of_range="hash"``);
- ``hash_lru``, ``hash_lfu``, ``hash_lru_min_count2``: a hash table of capacity C per column, eviction lru or
  lfu, and lru admitting an id at its second occurrence (counted in the table's count-min sketch, as wide as
  the capacity: it saturates over this stream, and late in it most new ids pass at their first occurrence);
- ``fixed_full``: a fixed table with a row for every distinct id of the stream (no collision): the upper bound.

C is 25% of the distinct ids the column has in the training rows (``--capacity-ratio``; the data table gives its
ratio to all distinct ids of the stream too). Seed S draws the stream with seed S and initialises the model with
seed S. Reported: valid AUC per arm, mean ± std (and min-max) over the seeds; two references computed from the
generator's true effects (Bayes: the true logit; reachable: the true effects of the ids seen in training, zero
for the others: about the best a model trained on these rows can do); a diagnostic column, the AUC of the same
trained model when the ids absent from the training rows read zeros (weight 0), as a hash table reads them; and
per hash arm and column the load factor, ids admitted / evicted / not admitted, and how many validation rows
find their id in the table against how many have an id seen in training.

    python benchmarks/hash_quality.py [--seeds 0 1 2] [--no-drift] [--lifetime-scale 1.0] [--capacity-ratio 0.25]

About a minute on the 2-core development machine (peak memory 0.7 GB), most of it drawing the streams.

``--no-drift`` draws every id's popularity constant over the stream (all born before it, no fade), and
``--lifetime-scale`` multiplies every L: controls, for how much the result depends on drift. The last line reads
``auc_fixed_modulo=X auc_hash_lru=Y margin=Z`` (means over the seeds, margin = Y - X).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from dataclasses import dataclass

os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".numba_cache"))

import numpy as np
import numpy.typing as npt
import torch
from torch import nn
from torchmetrics.functional.classification import binary_auroc

from embedding import (
    EmbeddingTableConfig,
    EvictionConfig,
    HashPolicy,
    JaggedIds,
    ShardedEmbeddingCollection,
    SparseFeatures,
    SparseOptimizer,
)
from embedding.optimizers.rowwise_adagrad import RowwiseAdagradConfig
from hash_table import spread  # benchmarks/hash_table.py: ids spread over int64 as a log's hashes


@dataclass(frozen=True)
class Column:
    """One categorical column of the generator (see the module's docstring)."""

    name: str
    num_ids: int  # K, the universe
    zipf: float  # s: the id of random rank r has popularity r ** -s
    lifetime: float  # L: mean fade time, as a fraction of the stream
    effect_std: float  # std of the per-id effect on the logit


COLUMNS = (
    Column("user", 1_000_000, 1.0, 0.3, 0.6),
    Column("item", 1_000_000, 1.1, 0.5, 0.6),
    Column("publisher", 200_000, 1.2, 2.0, 0.4),
    Column("query", 2_000_000, 1.0, 0.3, 0.4),
)
BASE_LOGIT = -1.5
PRE_EXISTING = 0.3
TIME_BLOCKS = 100

Ids = dict[str, npt.NDArray[np.int64]]


@dataclass
class Stream:
    """The rows of one seed, in time order."""

    ids: Ids
    labels: npt.NDArray[np.float32]
    effects: dict[str, npt.NDArray[np.float64]]  # each row's true effect, by column

    def logits(self) -> npt.NDArray[np.float64]:
        logits: npt.NDArray[np.float64] = BASE_LOGIT + np.sum(list(self.effects.values()), axis=0)
        return logits


def generate(seed: int, num_rows: int, drift: bool = True, lifetime_scale: float = 1.0) -> Stream:
    """The stream of ``num_rows`` rows drawn with ``seed`` (see the module's docstring)."""
    rng = np.random.default_rng(seed)
    edges = np.linspace(0, num_rows, TIME_BLOCKS + 1).astype(np.int64)
    ids, effects = {}, {}
    for number, column in enumerate(COLUMNS):
        k, lifetime = column.num_ids, column.lifetime * lifetime_scale
        popularity = (rng.permutation(k) + 1.0) ** -column.zipf
        born = rng.uniform(0.0, 1.0, k)
        old = int(PRE_EXISTING * k)
        born[:old] = rng.uniform(-2.0 * lifetime, 0.0, old)
        fade = rng.exponential(lifetime, k)
        if not drift:
            born[:], fade[:] = -1.0, np.inf
        effect = rng.normal(0.0, column.effect_std, k)
        index = np.empty(num_rows, dtype=np.int64)
        for block in range(TIME_BLOCKS):
            age = (block + 0.5) / TIME_BLOCKS - born
            weight = np.where(age >= 0.0, popularity * np.exp(-np.maximum(age, 0.0) / fade), 0.0)
            cumulative = np.cumsum(weight)
            draws = rng.uniform(0.0, cumulative[-1], int(edges[block + 1] - edges[block]))
            index[edges[block] : edges[block + 1]] = np.searchsorted(cumulative, draws, side="right")
        ids[column.name] = spread(index + (number << 40))
        effects[column.name] = effect[index]
    stream = Stream(ids, np.empty(0, dtype=np.float32), effects)
    stream.labels = (rng.uniform(size=num_rows) < 1.0 / (1.0 + np.exp(-stream.logits()))).astype(np.float32)
    return stream


@dataclass
class Split:
    """A stream cut in time: the training rows, then the validation rows."""

    train: Ids
    valid: Ids
    train_labels: npt.NDArray[np.float32]
    valid_labels: npt.NDArray[np.float32]
    seen: dict[str, npt.NDArray[np.bool_]]  # whether each validation row's id occurs in the training rows
    capacity: dict[str, int]

    @classmethod
    def of(cls, stream: Stream, num_train: int, capacity_ratio: float) -> Split:
        train = {name: column[:num_train] for name, column in stream.ids.items()}
        valid = {name: column[num_train:] for name, column in stream.ids.items()}
        seen = {name: np.isin(valid[name], train[name]) for name in train}
        capacity = {name: int(capacity_ratio * np.unique(column).size) for name, column in train.items()}
        return cls(train, valid, stream.labels[:num_train], stream.labels[num_train:], seen, capacity)


def auc(scores: npt.NDArray[np.float64] | torch.Tensor, labels: npt.NDArray[np.float32]) -> float:
    scores = torch.as_tensor(scores, dtype=torch.float64)
    return float(binary_auroc(torch.sigmoid(scores), torch.from_numpy(labels).long()))


class CTRModel(nn.Module):
    """A table per column; the pooled rows, concatenated, through a small MLP to one logit."""

    def __init__(self, collection: ShardedEmbeddingCollection, dim: int, hidden: int) -> None:
        super().__init__()
        self.collection = collection
        self.mlp = nn.Sequential(nn.Linear(len(COLUMNS) * dim, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, features: SparseFeatures) -> torch.Tensor:
        rows = self.collection(features)
        logits: torch.Tensor = self.mlp(torch.cat([rows[column.name] for column in COLUMNS], dim=1))
        return logits.squeeze(1)


@dataclass(frozen=True)
class Arm:
    name: str
    kind: str  # "modulo", "hash" or "full"
    policy: HashPolicy | None = None


ARMS = (
    Arm("fixed_modulo", "modulo"),
    Arm("hash_lru", "hash", HashPolicy(eviction=EvictionConfig("lru"))),
    Arm("hash_lfu", "hash", HashPolicy(eviction=EvictionConfig("lfu"))),
    Arm("hash_lru_min_count2", "hash", HashPolicy(min_count=2, eviction=EvictionConfig("lru"))),
    Arm("fixed_full", "full"),
)


@dataclass
class ArmRun:
    auc: float
    auc_unseen_zeroed: float
    seconds: float
    statistics: dict[str, dict[str, float]]  # hash arms: hash_table_statistics() plus "valid_held"


def features_of(
    ids: Ids, start: int, stop: int, weights: dict[str, npt.NDArray[np.bool_]] | None = None
) -> SparseFeatures:
    """Rows ``[start, stop)`` as one id per column and row; ``weights`` (0/1 per id) zero some of them."""
    features = {}
    for name, column in ids.items():
        jagged = JaggedIds.from_dense(torch.from_numpy(column[start:stop]).unsqueeze(1))
        if weights is not None:
            jagged = JaggedIds(jagged.ids, jagged.offsets, torch.from_numpy(weights[name][start:stop]).float())
        features[name] = jagged
    return SparseFeatures(features)


def run_arm(arm: Arm, split: Split, args: argparse.Namespace, seed: int) -> ArmRun:
    """Train ``arm`` on one pass over the training rows, in time order, and validate it."""
    train, valid = split.train, split.valid
    tables = []
    for column in COLUMNS:
        name = column.name
        if arm.kind == "full":  # a row per distinct id of the whole stream
            vocabulary, inverse = np.unique(np.concatenate([train[name], valid[name]]), return_inverse=True)
            train = {**train, name: inverse[: train[name].size].astype(np.int64)}
            valid = {**valid, name: inverse[train[name].size :].astype(np.int64)}
        table = EmbeddingTableConfig(
            name,
            vocabulary.size if arm.kind == "full" else split.capacity[name],
            dim=args.dim,
            features=(name,),
            init_scale=args.init_scale,
        )
        if arm.kind == "modulo":
            table = dataclasses.replace(table, out_of_range="hash")
        elif arm.kind == "hash":
            assert arm.policy is not None
            table = dataclasses.replace(table, kind="hash", hash_policy=arm.policy)
        tables.append(table)
    torch.manual_seed(seed)
    collection = ShardedEmbeddingCollection(tables, seed=seed)
    model = CTRModel(collection, args.dim, args.hidden)
    sparse = SparseOptimizer(collection, RowwiseAdagradConfig(lr=args.table_lr))
    dense = torch.optim.Adam(model.mlp.parameters(), lr=args.dense_lr)

    start = time.perf_counter()
    model.train()
    num_train = split.train_labels.size
    for first in range(0, num_train, args.batch_size):
        last = min(first + args.batch_size, num_train)
        dense.zero_grad()
        sparse.zero_grad()
        logits = model(features_of(train, first, last))
        nn.functional.binary_cross_entropy_with_logits(
            logits, torch.from_numpy(split.train_labels[first:last])
        ).backward()
        dense.step()
        sparse.step()
    seconds = time.perf_counter() - start

    model.eval()
    num_valid = split.valid_labels.size
    with torch.no_grad():
        scores = torch.cat([model(features_of(valid, i, i + 8192)) for i in range(0, num_valid, 8192)])
        zeroed = torch.cat([model(features_of(valid, i, i + 8192, split.seen)) for i in range(0, num_valid, 8192)])
    hash_tables = collection.hash_table_statistics()  # empty for fixed tables
    for name, table_statistics in hash_tables.items():
        dynamic = collection.shards[name].dynamic
        assert dynamic is not None
        table_statistics["valid_held"] = float(np.mean(dynamic.index.find(valid[name]) >= 0))
    return ArmRun(auc(scores, split.valid_labels), auc(zeroed, split.valid_labels), seconds, hash_tables)


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--train-rows", type=int, default=400_000)
    parser.add_argument("--valid-rows", type=int, default=100_000)
    parser.add_argument("--capacity-ratio", type=float, default=0.25)
    parser.add_argument("--no-drift", action="store_true")
    parser.add_argument("--lifetime-scale", type=float, default=1.0)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--table-lr", type=float, default=0.02)
    parser.add_argument("--dense-lr", type=float, default=0.03)
    parser.add_argument("--init-scale", type=float, default=0.01)
    parser.add_argument("--arms", nargs="+", default=[arm.name for arm in ARMS], choices=[arm.name for arm in ARMS])
    args = parser.parse_args()
    arms = [arm for arm in ARMS if arm.name in args.arms]
    begin = time.perf_counter()

    runs: dict[str, list[ArmRun]] = {arm.name: [] for arm in arms}
    references: dict[str, list[float]] = {"bayes": [], "reachable": []}
    data: dict[str, list[list[float]]] = {column.name: [] for column in COLUMNS}
    for seed in args.seeds:
        stream = generate(seed, args.train_rows + args.valid_rows, not args.no_drift, args.lifetime_scale)
        split = Split.of(stream, args.train_rows, args.capacity_ratio)
        valid_effects = {name: effect[args.train_rows :] for name, effect in stream.effects.items()}
        references["bayes"].append(auc(stream.logits()[args.train_rows :], split.valid_labels))
        reachable = sum(np.where(split.seen[name], valid_effects[name], 0.0) for name in valid_effects)
        references["reachable"].append(auc(np.asarray(reachable), split.valid_labels))
        for column in COLUMNS:
            name = column.name
            _, counts = np.unique(split.train[name], return_counts=True)
            distinct_all = np.unique(stream.ids[name]).size
            data[name].append(
                [
                    counts.size,
                    distinct_all,
                    split.capacity[name],
                    split.capacity[name] / distinct_all,
                    float(np.mean(counts == 1)),
                    float(np.mean(counts <= 3)),
                    float(np.sum(counts[counts <= 5]) / args.train_rows),
                    float(np.mean(split.seen[name])),
                ]
            )
        print(f"seed {seed}: stream drawn, {time.perf_counter() - begin:.0f} s", file=sys.stderr, flush=True)
        for arm in arms:
            run = run_arm(arm, split, args, seed)
            runs[arm.name].append(run)
            print(
                f"seed {seed} {arm.name}: valid auc={run.auc:.4f} (unseen ids zeroed {run.auc_unseen_zeroed:.4f}), "
                f"{run.seconds:.1f} s",
                file=sys.stderr,
                flush=True,
            )

    print(f"Data (mean over {len(args.seeds)} seeds; C = {args.capacity_ratio:g} x the distinct training ids):\n")
    print(
        "| column | distinct ids, train | distinct ids, all | C | C / all distinct | singletons | ids seen <= 3 times "
        "| training rows of ids seen <= 5 times | valid rows whose id occurs in training |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, rows in data.items():
        m = np.mean(rows, axis=0)
        print(
            f"| {name} | {m[0]:,.0f} | {m[1]:,.0f} | {m[2]:,.0f} | {m[3]:.3f} | {m[4]:.2f} | {m[5]:.2f} | {m[6]:.2f} "
            f"| {m[7]:.2f} |"
        )

    baseline = runs.get("fixed_modulo")
    print(f"\nValid AUC, mean ± std over seeds {args.seeds}:\n")
    print(
        "| arm | valid AUC | min - max | vs fixed_modulo, mean (per seed) | unseen ids zeroed (diagnostic) | train s |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, arm_runs in runs.items():
        aucs = [run.auc for run in arm_runs]
        mean, std = mean_std(aucs)
        zeroed = mean_std([run.auc_unseen_zeroed for run in arm_runs])
        margin = "-"
        if baseline is not None:
            margins = [run.auc - base.auc for run, base in zip(arm_runs, baseline)]
            margin = f"{statistics.mean(margins):+.4f} ({', '.join(f'{value:+.4f}' for value in margins)})"
        seconds = statistics.median(run.seconds for run in arm_runs)
        print(
            f"| {name} | {mean:.4f} ± {std:.4f} | {min(aucs):.4f} - {max(aucs):.4f} | {margin} "
            f"| {zeroed[0]:.4f} ± {zeroed[1]:.4f} | {seconds:.1f} |"
        )
    for name, values in references.items():
        mean, std = mean_std(values)
        what = "true logits" if name == "bayes" else "true effects of ids seen in training, 0 for others"
        print(f"| reference: {name} ({what}) | {mean:.4f} ± {std:.4f} | {min(values):.4f} - {max(values):.4f} | | | |")

    hash_arms = [arm.name for arm in arms if arm.kind == "hash"]
    if hash_arms:
        print("\nHash tables at the end of training (mean over seeds):\n")
        print(
            "| arm | column | load factor | admitted | evicted | not admitted | valid rows whose id holds a row "
            "| valid rows whose id occurs in training |"
        )
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for name in hash_arms:
            for column in COLUMNS:
                tables = [run.statistics[column.name] for run in runs[name]]
                m = {key: statistics.mean(table[key] for table in tables) for key in tables[0]}
                seen = statistics.mean(rows[7] for rows in data[column.name])
                print(
                    f"| {name} | {column.name} | {m['load_factor']:.3f} | {m['admitted']:,.0f} | {m['evicted']:,.0f} "
                    f"| {m['rejected']:,.0f} | {m['valid_held']:.3f} | {seen:.3f} |"
                )

    print(f"\n{time.perf_counter() - begin:.0f} s in all.")
    if "fixed_modulo" in runs and "hash_lru" in runs:
        modulo = mean_std([run.auc for run in runs["fixed_modulo"]])[0]
        lru = mean_std([run.auc for run in runs["hash_lru"]])[0]
        print(f"auc_fixed_modulo={modulo:.4f} auc_hash_lru={lru:.4f} margin={lru - modulo:.4f}")


if __name__ == "__main__":
    main()
