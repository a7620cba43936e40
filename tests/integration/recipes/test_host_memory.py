"""A training process keeps freed host memory for its next step rather than faulting it in again (GitHub issue 17),
measured in processes of their own, and says so at start-up."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.resume_helpers import check_ok, run_recipes

# Three 20 MiB tensors a step, made, written and freed, as a step's large activations are; the
# minor page faults per step after the first. glibc as it is hands some of them back to the
# system at every step (a thousand faults a step here).
_FAULTS_PER_STEP = """
import resource, sys
import numpy as np
from recipes.runtime.host_memory import keep_freed_memory
if sys.argv[1] == "keep":
    print(keep_freed_memory())
def step():
    parts = [np.ones(5 << 20, dtype=np.float32) for _ in range(3)]
    return float(sum(part[0] for part in parts))
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    step()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10)
"""


def _faults_per_step(mode: str) -> tuple[str, float]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("MALLOC_")}
    result = subprocess.run(
        [sys.executable, "-c", _FAULTS_PER_STEP, mode], capture_output=True, text=True, check=True, env=env
    )
    *lines, faults = result.stdout.splitlines()
    return "\n".join(lines), float(faults)


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's malloc")
def test_kept_memory_is_reused_where_glibc_would_fault_it_in_again() -> None:
    _, faults_as_is = _faults_per_step("as-is")
    line, faults_kept = _faults_per_step("keep")

    assert line.startswith("host memory: glibc's malloc keeps up to 1024 MiB freed for reuse")
    assert faults_as_is > 100, "the control no longer faults: this test shows nothing"
    assert faults_kept < faults_as_is / 100


def test_training_says_at_start_up_what_it_did_with_host_memory(tmp_path: Path) -> None:
    output_dir = tmp_path / "run"
    check_ok(run_recipes(tmp_path, "train", "ctr_tiny", "-o", str(output_dir), "trainer.max_num_steps=2"))

    assert "host memory: glibc's malloc keeps up to 1024 MiB" in (output_dir / "logs" / "rank_0.log").read_text()
