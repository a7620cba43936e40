"""Reading a run while it trains (issue 45): ``eval``, ``predict`` and ``export`` get the checkpoint they chose, or the
next one, every time, while ``train`` saves every 2 steps and keeps only the last; the trainer deletes none being read.

Without read leases the reader chose a checkpoint, spent seconds building the recipe's parts, and found it pruned:
3 failures in 3 of each command, measured by a user.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from support.resume_helpers import (
    RUN_TIMEOUT_S,
    checkpoints_dir,
    committed_steps,
    kill_hard,
    recipes_env,
    start_recipes,
    wait_for_checkpoint,
)

NUM_READS = 20

TRAINS_UNTIL_KILLED = (
    "trainer.max_num_steps=100000000",
    "trainer.validate_every_n_steps=50",
    "trainer.publish_metrics_every_n_steps=50",
    "checkpoint.every_n_steps=2",
    "checkpoint.keep_last_n=1",
    "checkpoint.keep_best_n=null",
    "dataset.num_train_samples=1024",
    "dataset.num_valid_samples=64",
    "dataset.batch_size=32",
    "metrics.recorders.console=false",
)


# A reader process: the reads it is given in turn, each as `python -m recipes ARGS` would run it; one exit code per
# read on its last line. Ten reads in one process rather than ten processes: the reads are what the test is about,
# and each new interpreter spent 3 s of CPU importing torch while the trainer saved every 2 steps beside it.
READER = """
import json, sys
from recipes.cli.main import main
codes = [main(args) for args in json.loads(sys.argv[1])]
print(json.dumps(codes))
"""


def read_args(number: int) -> list[str]:
    """Read number ``number``: ``eval --checkpoint last``, ``predict`` (``auto``) or ``export`` (``auto``) in turn."""
    kind = ("eval", "predict", "export")[number % 3]
    if kind == "eval":
        return ["eval", "run", "--checkpoint", "last"]
    if kind == "predict":
        return ["predict", "run", "-o", f"predictions_{number}.csv"]
    return ["export", "run", "-o", f"export_{number}"]


def read_in_turn(tmp_path: Path, numbers: range) -> dict[int, str]:
    """The reads ``numbers``, one after another in one process: the failed ones, with the process's output."""
    reads = json.dumps([read_args(number) for number in numbers])
    result = subprocess.run(
        [sys.executable, "-c", READER, reads],
        cwd=tmp_path,
        env=recipes_env(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S * len(numbers),
    )
    lines = result.stdout.strip().splitlines()
    codes = json.loads(lines[-1]) if result.returncode == 0 and lines else [None] * len(numbers)
    why = f"exit {result.returncode}: {result.stderr[-1200:]}"
    return {number: why for number, code in zip(numbers, codes) if code != 0}


@pytest.mark.timeout(900)
def test_twenty_reads_of_a_run_that_prunes_every_checkpoint_at_the_next_all_succeed(tmp_path: Path) -> None:
    trainer = start_recipes(tmp_path, "train", "ctr_tiny", "-o", "run", *TRAINS_UNTIL_KILLED)
    try:
        wait_for_checkpoint(tmp_path / "run", 2, trainer)
        with ThreadPoolExecutor(max_workers=2) as readers:  # Two at a time: they share leases too.
            halves = (range(0, NUM_READS, 2), range(1, NUM_READS, 2))
            failures = [
                f for failed in readers.map(lambda reads: read_in_turn(tmp_path, reads), halves) for f in failed.items()
            ]
        still_training = trainer.poll() is None
        trainer.terminate()  # Finishes its step and commits; a kill -9 could cut a prune short.
        trainer.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if trainer.poll() is None:
            kill_hard(trainer)

    assert trainer.returncode == 0
    assert failures == []
    assert still_training, "the run ended before the reads did, so they did not read a running job"
    assert all((tmp_path / f"predictions_{n}.csv").is_file() for n in range(1, NUM_READS, 3))
    assert all((tmp_path / f"export_{n}" / "model.json").is_file() for n in range(2, NUM_READS, 3))
    # Whatever a lease kept from a prune is a whole checkpoint still, and nothing was taken for damage.
    left = sorted(path.name for path in checkpoints_dir(tmp_path / "run").iterdir() if ".tmp-" not in path.name)
    assert left == [f"step_{step}" for step in committed_steps(tmp_path / "run")]
