"""A GPU and a CPU run of one preset with hash tables: their hash-table metrics step by step, and the ids each
table holds at the end (from ``export-tables``), must be the same; their losses differ by float rounding alone.

    for device in cuda cpu; do
        python -m recipes train dlrm_criteo_tiny_dynamic -o run_$device trainer.device=$device
        python -m recipes export-tables run_$device -o export_$device
    done
    python benchmarks/gpu_cpu_hash_runs.py run_cuda run_cpu export_cuda export_cpu

(About 90 s on an H200 machine, so ``benchmarks/gpu_checks.sh`` leaves it out; its ``gpu_paths.py`` trains hash
tables on the GPU in every mode.)
"""

import json
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq


def hash_metrics(run: str) -> tuple[dict[int, dict[str, float]], list[dict[str, Any]]]:
    """The ``hash_tables/*`` metrics of every logged training step, and every logged record."""
    records = [json.loads(line) for line in Path(run, "metrics", "train.jsonl").read_text().splitlines()]
    by_step = {r["step"]: {k: v for k, v in r.items() if k.startswith("hash_tables/")} for r in records}
    return by_step, records


def held_ids(export: str, table: str) -> list[int]:
    return sorted(pq.read_table(Path(export, table)).column("id").to_pylist())


def main() -> None:
    gpu_run, cpu_run, gpu_export, cpu_export = sys.argv[1:5]
    (gpu, gpu_records), (cpu, cpu_records) = hash_metrics(gpu_run), hash_metrics(cpu_run)
    common = sorted(set(gpu) & set(cpu))
    differing = [step for step in common if gpu[step] != cpu[step]]
    print(
        f"hash-table metrics differ at {len(differing)} of {len(common)} logged steps (GPU {len(gpu)}, CPU {len(cpu)})"
    )
    print("last losses: GPU", [round(r["loss"], 4) for r in gpu_records[-5:]])
    print("             CPU", [round(r["loss"], 4) for r in cpu_records[-5:]])
    tables = sorted(path.name for path in Path(cpu_export).glob("*.parquet"))
    same = sum(held_ids(gpu_export, table) == held_ids(cpu_export, table) for table in tables)
    print(f"tables holding the same ids at the end: {same} of {len(tables)}")
    for name, run in (("GPU", gpu_run), ("CPU", cpu_run)):
        print(name, "last validation:", Path(run, "metrics", "valid.jsonl").read_text().splitlines()[-1][:150])


if __name__ == "__main__":
    main()
