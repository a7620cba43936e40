"""Throughput and memory of the tabular readers producing ready batches, against a bare read of the same file.

CSV/TSV: ``TabularReader`` reads a synthetic Criteo-format TSV (label, 13 counts, 26 hex hashes,
empty fields) through the Criteo schema (``recsys.builtin.dlrm.criteo.criteo_schema``: counts as
``log(max(x, 0) + 1)``, categorical text hashed to ids) and builds CTRBatch tensors (unshuffled,
one rank), against a *bare* ``pandas.read_csv`` of the file (its C parser, no conversion at all),
the comparison issue 14 asks for.

Parquet: the same rows as Parquet (label and I1-I13 int64, C1-C26 strings, empty fields as nulls;
row groups of 65,536 rows, a Parquet file's unit of reading); ``ParquetReader`` producing ready
batches against a bare ``pyarrow.parquet.read_table``.

The two sides of a comparison take turns, repeat after repeat, and the ratio is the median of the
per-repeat ratios, so that a burst of load from elsewhere on the machine hits both sides. Peak
memory is measured in separate passes on the timed file and on one twice as long, to show that a
reader's peak does not grow with the file (a much shorter file would not fill the chunks a reader
holds in flight, and would understate its peak): by tracemalloc for CSV (numpy and pandas report
their buffers to it), and for Parquet by tracemalloc plus Arrow's memory pool (pyarrow allocates
out of tracemalloc's sight), each in a fresh process.

    .venv/bin/python benchmarks/reader_throughput.py --num-rows 500000 --repeats 5 [--parse-threads 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numba
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

try:
    import pandas as pd
except ImportError:
    sys.exit("error: benchmarks/reader_throughput.py compares against pandas: pip install -e '.[bench]'")

from recsys.builtin.dlrm.criteo import COLUMN_NAMES, criteo_schema
from recsys.builtin.dlrm.criteo_synthetic import write_synthetic_criteo
from recsys.tabular.formats.arrow import ArrowFormatConfig
from recsys.tabular.formats.delimited_text import TabularReader
from recsys.tabular.formats.parquet import ParquetReader

TABLE_SIZE = 10_000_000
CRITEO_SCHEMA = criteo_schema(TABLE_SIZE)
PARQUET_SCHEMA = dataclasses.replace(CRITEO_SCHEMA, format=ArrowFormatConfig("parquet"))

BATCH_SIZE = 4096
PARQUET_ROW_GROUP_ROWS = 65_536


def read_with_tabular(path: str, parse_threads: int = 1) -> int:
    reader = TabularReader(path, CRITEO_SCHEMA, batch_size=BATCH_SIZE, shuffle=False, parse_threads=parse_threads)
    return sum(batch.batch_size for step in reader for batch in step)


def read_with_bare_pandas(path: str) -> int:
    return len(pd.read_csv(path, sep="\t", header=None))


def timed(read: Callable[[str], int], path: str) -> tuple[float, int]:
    start = time.perf_counter()
    rows = read(path)
    return time.perf_counter() - start, rows


def compare(
    read: Callable[[str], int], baseline: Callable[[str], int], path: str, repeats: int
) -> tuple[float, float, float, int, int]:
    """Median seconds of each side, taking turns, the median of the per-repeat throughput ratios, and the rows."""
    read(path)  # Loads the numba kernels (a start-up cost, not throughput).
    times, baseline_times, ratios, rows, baseline_rows = [], [], [], 0, 0
    for _ in range(repeats):
        seconds, rows = timed(read, path)
        baseline_seconds, baseline_rows = timed(baseline, path)
        times.append(seconds)
        baseline_times.append(baseline_seconds)
        ratios.append((rows / seconds) / (baseline_rows / baseline_seconds))
    return statistics.median(times), statistics.median(baseline_times), statistics.median(ratios), rows, baseline_rows


def peak_bytes(read: Callable[[str], int], path: str) -> int:
    tracemalloc.start()
    read(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def write_criteo_parquet(tsv_path: str, parquet_path: str) -> None:
    """The rows of a Criteo-format TSV as Parquet: int64 label and counts, string hashes, empty fields as nulls."""
    names = list(COLUMN_NAMES)
    types = {name: pa.int64() if name == "label" or name.startswith("I") else pa.string() for name in names}
    table = pa_csv.read_csv(
        tsv_path,
        read_options=pa_csv.ReadOptions(column_names=names),
        parse_options=pa_csv.ParseOptions(delimiter="\t", quote_char=False),
        convert_options=pa_csv.ConvertOptions(column_types=types, strings_can_be_null=True),
    )
    pq.write_table(table, parquet_path, row_group_size=PARQUET_ROW_GROUP_ROWS)


def read_with_parquet(path: str, parse_threads: int = 1) -> int:
    reader = ParquetReader(path, PARQUET_SCHEMA, batch_size=BATCH_SIZE, shuffle=False, parse_threads=parse_threads)
    return sum(batch.batch_size for step in reader for batch in step)


def read_with_bare_read_table(path: str) -> int:
    return int(pq.read_table(path).num_rows)


def _peak_with_arrow(read: Callable[[str], int], path: str) -> int:
    """Run in a fresh process: the Arrow pool's peak is its whole life's."""
    return peak_bytes(read, path) + int(pa.default_memory_pool().max_memory() or 0)


def peak_bytes_with_arrow(read: Callable[[str], int], path: str) -> int:
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return int(pool.apply(_peak_with_arrow, (read, path)))


def parquet_report(timed_tsv: str, long_tsv: str, num_rows: int, repeats: int, parse_threads: int) -> list[str]:
    """Writes the two TSV files as Parquet beside them, times and measures both sides: the lines to print."""
    timed_path, long_path = timed_tsv.replace(".tsv", ".parquet"), long_tsv.replace(".tsv", ".parquet")
    write_criteo_parquet(timed_tsv, timed_path)
    write_criteo_parquet(long_tsv, long_path)
    size_mb = Path(timed_path).stat().st_size / 1e6
    read_parquet = partial(read_with_parquet, parse_threads=parse_threads)
    reader_s, bare_s, ratio, reader_rows, bare_rows = compare(
        read_parquet, read_with_bare_read_table, timed_path, repeats
    )
    sides = (("reader", read_parquet), ("bare", read_with_bare_read_table))
    paths = (timed_path, long_path)
    memory = {(name, path): peak_bytes_with_arrow(read, path) / 1e6 for name, read in sides for path in paths}

    lines = [
        f"\nParquet: {num_rows} rows, {size_mb:.0f} MB, row groups of {PARQUET_ROW_GROUP_ROWS} rows, median of "
        f"{repeats}; peak MB: tracemalloc + Arrow's pool\n",
        f"| side | rows/s | median s | peak MB ({num_rows} rows) | peak MB ({2 * num_rows} rows) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, key, seconds, rows in (
        ("ParquetReader (criteo_kaggle schema)", "reader", reader_s, reader_rows),
        ("bare pyarrow.parquet.read_table", "bare", bare_s, bare_rows),
    ):
        lines.append(
            f"| {name} | {rows / seconds:,.0f} | {seconds:.2f} | {memory[key, timed_path]:.0f} | "
            f"{memory[key, long_path]:.0f} |"
        )
    lines.append(f"\nparquet / bare read_table throughput: {ratio:.2f}x (median of the per-repeat ratios)")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-rows", type=int, default=500_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--parse-threads", type=int, default=1, help="the readers' `parse_threads`")
    args = parser.parse_args()
    read_tabular = partial(read_with_tabular, parse_threads=args.parse_threads)

    with tempfile.TemporaryDirectory() as directory:
        timed_path, long_path = f"{directory}/timed.tsv", f"{directory}/long.tsv"
        write_synthetic_criteo(timed_path, args.num_rows, seed=0)
        write_synthetic_criteo(long_path, 2 * args.num_rows, seed=1)
        size_mb = Path(timed_path).stat().st_size / 1e6

        tabular_s, bare_s, ratio, tabular_rows, bare_rows = compare(
            read_tabular, read_with_bare_pandas, timed_path, args.repeats
        )
        sides = (("tabular", read_tabular), ("bare", read_with_bare_pandas))
        paths = (timed_path, long_path)
        memory = {(name, path): peak_bytes(read, path) / 1e6 for name, read in sides for path in paths}
        parquet = parquet_report(timed_path, long_path, args.num_rows, args.repeats, args.parse_threads)

    print(
        f"`{' '.join([Path(sys.executable).name, *sys.argv])}`: {args.num_rows} rows, {size_mb:.0f} MB, "
        f"median of {args.repeats}, numba threads: {numba.get_num_threads()}, parse threads: {args.parse_threads}\n"
    )
    print(f"| side | rows/s | median s | peak MB ({args.num_rows} rows) | peak MB ({2 * args.num_rows} rows) |")
    print("| --- | --- | --- | --- | --- |")
    for name, key, seconds, rows in (
        ("TabularReader (Criteo schema)", "tabular", tabular_s, tabular_rows),
        ("bare pandas.read_csv", "bare", bare_s, bare_rows),
    ):
        peaks = f"{memory[key, timed_path]:.0f} | {memory[key, long_path]:.0f}"
        print(f"| {name} | {rows / seconds:,.0f} | {seconds:.2f} | {peaks} |")
    print(f"\ntabular / bare pandas throughput: {ratio:.2f}x (median of the per-repeat ratios)")
    print("\n".join(parquet))


if __name__ == "__main__":
    main()
