"""A job of two ranks splits the cores between them, in torch and numba alike, and says so at start-up (GitHub
issue 17); ``tests/unit/recipes/test_threads.py`` checks the arithmetic of each rank's share."""

from __future__ import annotations

import os
import re
from pathlib import Path

from support.resume_helpers import check_ok, run_recipes


def test_two_ranks_split_the_cores_and_the_start_up_line_says_how(tmp_path: Path) -> None:
    output_dir = tmp_path / "run"
    args = ["train", "ctr_tiny", "-o", str(output_dir), "trainer.max_num_steps=5", "metrics.recorders.console=false"]
    result = check_ok(run_recipes(tmp_path, *args, "--nproc", "2"))

    # The share is of the cores free at start-up (another test may keep one busy), as the line says.
    line = re.search(
        r"threads: (\d+) per rank for torch and numba, from (\d+) of (\d+) cores free .* / 2 rank\(s\)", result.stdout
    )
    assert line is not None, result.stdout
    share, free, present = (int(group) for group in line.groups())
    assert present == len(os.sched_getaffinity(0)) and 1 <= free <= present
    assert share == max(1, free // 2)
    expected = f"threads: {share} per rank for torch and numba"
    for rank in (0, 1):
        assert expected in (output_dir / "logs" / f"rank_{rank}.log").read_text()
        assert f"numba pool of {share} thread(s)" in (output_dir / "logs" / f"rank_{rank}.log").read_text()
