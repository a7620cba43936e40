"""Throughput and memory of the Criteo reader and the schema-driven tabular reader against pandas.read_csv.

The tabular reader reads the same file through the ``criteo_kaggle`` schema (hashing the categorical
text instead of parsing hex) and is compared with a *bare* ``pandas.read_csv`` (no conversion at all),
the comparison issue 14 asks for.

Both sides turn the same generated file into the same arrays: labels, the 13 integer features
as ``log(max(x, 0) + 1)`` (empty: 0) in float32, and the 26 hex hashes as ``int(h, 16) % size``
(empty: 0) in int64. The reader streams and also builds CTRBatch tensors (unshuffled, one
rank); pandas loads the whole file with its C parser, then converts the hex strings with
``int(h, 16)`` per value (it has no vectorised hex parser). Peak memory is measured with
tracemalloc in separate passes (numpy and pandas report their buffers to it), on two file
sizes, to show that the reader's peak does not grow with the file while pandas' does.

    .venv/bin/python benchmarks/reader_throughput.py --num-rows 500000 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from recipes.builtin.dlrm.criteo import NUM_DENSE_FEATURES, NUM_SPARSE_FEATURES, CriteoReader
from recipes.builtin.dlrm.criteo_synthetic import write_synthetic_criteo
from recipes.tabular.reader import TabularReader
from recipes.tabular.schema import CategoricalColumns, DenseColumns, LabelColumn, TabularDataSection

CRITEO_SCHEMA = TabularDataSection(
    format="tsv",
    header=False,
    quote_char=None,
    column_names=["label", "I{1..13}", "C{1..26}"],
    label=LabelColumn(column="label"),
    dense=[DenseColumns(columns=["I{1..13}"], log=True)],
    categorical=[CategoricalColumns(columns=["C{1..26}"], num_buckets=10_000_000)],
)

TABLE_SIZE = 10_000_000
BATCH_SIZE = 4096


def read_with_reader(path: str) -> int:
    reader = CriteoReader(path, batch_size=BATCH_SIZE, num_embeddings_per_feature=TABLE_SIZE, shuffle=False)
    return sum(batch.batch_size for step in reader for batch in step)


def read_with_tabular(path: str) -> int:
    reader = TabularReader(path, CRITEO_SCHEMA, batch_size=BATCH_SIZE, shuffle=False)
    return sum(batch.batch_size for step in reader for batch in step)


def read_with_bare_pandas(path: str) -> int:
    return len(pd.read_csv(path, sep="\t", header=None))


def read_with_pandas(path: str) -> int:
    frame = pd.read_csv(path, sep="\t", header=None, dtype={c: str for c in range(14, 40)})
    labels = frame[0].to_numpy(np.float32)
    dense_values = frame.iloc[:, 1 : 1 + NUM_DENSE_FEATURES].fillna(0).clip(lower=0).to_numpy(np.float64)
    dense = np.log1p(dense_values).astype(np.float32)
    sparse = np.empty((len(frame), NUM_SPARSE_FEATURES), dtype=np.int64)
    for k, column in enumerate(range(14, 40)):
        hashes = frame[column].map(lambda h: int(h, 16), na_action="ignore").fillna(0).to_numpy(np.int64)
        sparse[:, k] = hashes % TABLE_SIZE
    assert len(labels) == len(dense) == len(sparse)
    return len(labels)


def median_seconds(read: Callable[[str], int], path: str, repeats: int) -> tuple[float, int]:
    times, rows = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        rows = read(path)
        times.append(time.perf_counter() - start)
    return statistics.median(times), rows


def peak_bytes(read: Callable[[str], int], path: str) -> int:
    tracemalloc.start()
    read(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-rows", type=int, default=500_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as directory:
        big, small = f"{directory}/big.tsv", f"{directory}/small.tsv"
        write_synthetic_criteo(big, args.num_rows, seed=0)
        write_synthetic_criteo(small, args.num_rows // 5, seed=1)
        size_mb = Path(big).stat().st_size / 1e6

        reader_s, reader_rows = median_seconds(read_with_reader, big, args.repeats)
        pandas_s, pandas_rows = median_seconds(read_with_pandas, big, args.repeats)
        tabular_s, tabular_rows = median_seconds(read_with_tabular, big, args.repeats)
        bare_s, bare_rows = median_seconds(read_with_bare_pandas, big, args.repeats)
        sides = (("reader", read_with_reader), ("pandas", read_with_pandas), ("tabular", read_with_tabular))
        memory = {(name, path): peak_bytes(read, path) / 1e6 for name, read in sides for path in (small, big)}

    print(
        f"`{' '.join([Path(sys.executable).name, *sys.argv])}`: {args.num_rows} rows, {size_mb:.0f} MB, "
        f"median of {args.repeats}\n"
    )
    print(f"| side | rows/s | median s | peak MB ({args.num_rows // 5} rows) | peak MB ({args.num_rows} rows) |")
    print("| --- | --- | --- | --- | --- |")
    for name, key, seconds, rows in (
        ("CriteoReader", "reader", reader_s, reader_rows),
        ("pandas.read_csv + conversion", "pandas", pandas_s, pandas_rows),
        ("TabularReader (criteo_kaggle schema)", "tabular", tabular_s, tabular_rows),
        ("bare pandas.read_csv", None, bare_s, bare_rows),
    ):
        peaks = "- | -" if key is None else f"{memory[key, small]:.0f} | {memory[key, big]:.0f}"
        print(f"| {name} | {rows / seconds:,.0f} | {seconds:.2f} | {peaks} |")
    print(
        f"\nreader / pandas throughput: {(reader_rows / reader_s) / (pandas_rows / pandas_s):.2f}x "
        f"(the reader drops the last {pandas_rows - reader_rows} rows that fill no whole batch)"
    )
    print(f"tabular / bare pandas throughput: {(tabular_rows / tabular_s) / (bare_rows / bare_s):.2f}x")


if __name__ == "__main__":
    main()
