"""Helpers of the end-to-end checkpoint tests: run ``python -m recipes`` as a user would, and read what it leaves.

The tests start real processes, kill them, and start them again, so these helpers speak in
terms of a run's output directory: its checkpoints, metric lines and TensorBoard events.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from checkpoint.loaded import shared_file_name, shared_keys
from checkpoint.metadata import CheckpointMetadata
from checkpoint.serialization import read_torch_file
from checkpoint.store import CheckpointStore
from support import warm_runs
from support.paths import ROOT, STALLING_CLI

# A ctr_tiny run that takes a few seconds: 32 steps per data epoch, so 40 steps cross an epoch
# boundary; metrics are published every 4 steps, so checkpoints of steps 10 and 30 hold metric
# state accumulated over steps not yet published, which a resume must restore.
TINY_RUN = (
    "trainer.max_num_steps=40",
    "trainer.validate_every_n_steps=20",
    "trainer.publish_metrics_every_n_steps=4",
    "checkpoint.every_n_steps=10",
    "dataset.num_train_samples=1024",
    "dataset.num_valid_samples=256",
    "dataset.batch_size=32",
    "dataset.vocab_size=200",
    "metrics.recorders.console=false",
)

FINAL_STEP = 40

# A dlrm_criteo_tiny-sized run of 60 steps on 6,000 synthetic rows, checkpointed every 20 steps, all kept: short
# enough for a 2-rank job, long enough for a resume from a middle checkpoint to cross a validation.
DLRM_60_STEPS = (
    "trainer.max_num_steps=60",
    "trainer.validate_every_n_steps=20",
    "trainer.publish_metrics_every_n_steps=10",
    "checkpoint.every_n_steps=20",
    "checkpoint.keep_last_n=null",
    "checkpoint.keep_best_n=null",
    "dataset.synthetic_rows=6000",
    "dataset.batch_size=64",
)

# Metrics that measure the clock, not the arithmetic; they differ between any two runs.
WALL_CLOCK_METRICS = frozenset({"throughput"})

RUN_TIMEOUT_S = 180.0


def recipes_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a child run: this one's numba cache and settings, WandB offline."""
    env = dict(os.environ)
    env.setdefault("NUMBA_CACHE_DIR", str(ROOT / ".numba_cache"))
    env["WANDB_MODE"] = "offline"
    env["WANDB_SILENT"] = "true"
    env.update(extra or {})
    return env


def run_recipes(
    cwd: Path, *args: str, env: Mapping[str, str] | None = None, timeout: float = RUN_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m recipes ARGS`` to the end in ``cwd`` (forked from a warm interpreter: ``support.warm_runs``)."""
    return warm_runs.run([sys.executable, "-m", "recipes", *args], cwd, recipes_env(env), timeout)


def start_recipes(cwd: Path, *args: str, env: Mapping[str, str] | None = None, stalling: bool = False) -> Any:
    """Start ``python -m recipes ARGS`` (or the stalling CLI, see ``stalling_cli.py``) without waiting."""
    program = [str(STALLING_CLI)] if stalling else ["-m", "recipes"]
    return subprocess.Popen(
        [sys.executable, *program, *args],
        cwd=cwd,
        env=recipes_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def train_args(output_dir: Path, *overrides: str, preset: str = "ctr_tiny") -> list[str]:
    return ["train", preset, "-o", str(output_dir), *TINY_RUN, *overrides]


def shared_run(tmp_path_factory: pytest.TempPathFactory, name: str, *overrides: str) -> Path:
    """The output directory of a tiny run trained once per test session, on first request.

    Several modules compare against the same uninterrupted run; a test that changes a run
    works on a ``copy_run`` of it.
    """
    root = tmp_path_factory.getbasetemp() / "shared_runs" / name
    output_dir = root / "run"
    if not (root / "DONE").exists():
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        check_ok(run_recipes(root, *train_args(output_dir, *overrides)))
        (root / "DONE").touch()
    return output_dir


def copy_run(output_dir: Path, destination: Path) -> Path:
    shutil.copytree(output_dir, destination)
    return destination


def check_ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result


def wait_until(condition: Callable[[], bool], process: Any, timeout: float = RUN_TIMEOUT_S) -> None:
    """Poll ``condition`` every few milliseconds while ``process`` runs; fail if it ends or times out first."""
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            _, stderr = process.communicate()
            raise AssertionError(f"The run ended (exit {process.returncode}) before the condition held:\n{stderr}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"The condition did not hold within {timeout} s.")
        time.sleep(0.005)


def wait_for_checkpoint(output_dir: Path, step: int, process: Any) -> None:
    """Wait until a checkpoint of ``step`` or later is committed."""
    wait_until(lambda: max(committed_steps(output_dir), default=0) >= step, process)


def kill_hard(process: Any) -> None:
    """``kill -9``: no handler, no cleanup, as when a machine is lost."""
    process.kill()
    process.communicate(timeout=30)
    assert process.returncode == -signal.SIGKILL


# What a run leaves -----------------------------------------------------------------------------


def checkpoints_dir(output_dir: Path) -> Path:
    return output_dir / "checkpoints"


def committed_steps(output_dir: Path) -> list[int]:
    """The steps of the directories named exactly ``step_N`` that hold a metadata file."""
    root = checkpoints_dir(output_dir)
    if not root.is_dir():
        return []
    names = [p.name for p in root.iterdir() if (p / "metadata.json").is_file()]
    return sorted(int(name[len("step_") :]) for name in names if name.startswith("step_") and name[5:].isdigit())


def step_dirs(output_dir: Path) -> list[Path]:
    """Every directory named exactly ``step_N``, committed or not."""
    root = checkpoints_dir(output_dir)
    return sorted(p for p in root.iterdir() if p.name.startswith("step_") and p.name[5:].isdigit())


def read_metadata(step_dir: Path) -> CheckpointMetadata:
    return CheckpointMetadata.from_json((step_dir / "metadata.json").read_text(), str(step_dir))


def load_verified(step_dir: Path, file_name: str) -> dict[str, Any]:
    """A checkpoint file read as the manager reads it: size and SHA-256 checked, weights only."""
    store = CheckpointStore(str(step_dir.parent))
    record = read_metadata(step_dir).files[file_name]
    return read_torch_file(store.fs, str(step_dir / file_name), record)


def load_shared_verified(step_dir: Path) -> dict[str, Any]:
    """The shared state of a checkpoint, from its files other than ``rank_K.pt``, each checked."""
    keys = shared_keys(read_metadata(step_dir))
    return {key: load_verified(step_dir, shared_file_name(key))[key] for key in keys}


def load_weights_only(path: Path) -> Any:
    return torch.load(path, map_location="cpu", weights_only=True)


def assert_bitwise_equal(left: Any, right: Any, where: str = "state") -> None:
    """Tensors equal bit for bit (NaNs included), containers of the same keys, other values equal."""
    if isinstance(left, torch.Tensor):
        assert isinstance(right, torch.Tensor), f"{where}: a tensor against {type(right).__name__}"
        assert (left.dtype, left.shape) == (right.dtype, right.shape), f"{where}: dtype or shape differ"
        same = left.view(-1).view(torch.uint8).equal(right.view(-1).view(torch.uint8)) if left.numel() else True
        assert same, f"{where}: the tensors differ"
    elif isinstance(left, Mapping):
        assert isinstance(right, Mapping) and set(left) == set(right), f"{where}: the keys differ"
        for key in left:
            assert_bitwise_equal(left[key], right[key], f"{where}[{key!r}]")
    elif isinstance(left, list | tuple):
        assert isinstance(right, list | tuple) and len(left) == len(right), f"{where}: the lengths differ"
        for index, (a, b) in enumerate(zip(left, right)):
            assert_bitwise_equal(a, b, f"{where}[{index}]")
    else:
        assert left == right, f"{where}: {left!r} != {right!r}"


def metric_history(output_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Each ``metrics/<run>.jsonl`` as its list of lines, without the wall-clock metrics."""
    history = {}
    for path in sorted((output_dir / "metrics").glob("*.jsonl")):
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        history[path.stem] = [{k: v for k, v in line.items() if k not in WALL_CLOCK_METRICS} for line in lines]
    return history


def tensorboard_scalars(output_dir: Path, run: str, tag: str) -> list[tuple[int, float]]:
    """The ``(step, value)`` events of ``tag`` in ``tb/<run>`` as TensorBoard shows them (purged ones hidden)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(output_dir / "tb" / run), size_guidance={"scalars": 0})
    accumulator.Reload()
    return [(event.step, event.value) for event in accumulator.Scalars(tag)]


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    """The single ``error: ...`` line a failed command prints, asserting there is no traceback."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The last ``error: ...`` line of a failed command (the CLI's own summary of the failure)."""
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors, result.stderr
    return errors[-1]


def final_states(output_dir: Path, step: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The shared state and rank 0's state of the checkpoint of ``step``, without wall-clock metric state."""
    step_dir = checkpoints_dir(output_dir) / f"step_{step}"
    keys = shared_keys(read_metadata(step_dir))
    shared = {key: load_weights_only(step_dir / shared_file_name(key))[key] for key in keys}
    rank = load_weights_only(step_dir / "rank_0.pt")
    rank["metrics"] = {k: v for k, v in rank["metrics"].items() if k not in WALL_CLOCK_METRICS}
    return shared, rank


def assert_same_training(reference: Path, resumed: Path, final_step: int) -> None:
    """Two runs that must have done the same arithmetic: same final checkpoint, metric lines and curves."""
    shared_ref, rank_ref = final_states(reference, final_step)
    shared_new, rank_new = final_states(resumed, final_step)
    assert_bitwise_equal(shared_ref, shared_new, "shared state")
    assert_bitwise_equal(rank_ref, rank_new, "rank_0.pt")
    assert metric_history(reference) == metric_history(resumed)
    for run, tag in (("train", "loss"), ("valid", "auc")):
        expected = tensorboard_scalars(reference, run, tag)
        curve = tensorboard_scalars(resumed, run, tag)
        steps = [step for step, _ in curve]
        assert steps == sorted(set(steps)), f"the {run}/{tag} curve doubles back: {steps}"
        assert curve == expected


def stall_env(point: str, step: int, marker: Path) -> dict[str, str]:
    """The environment that makes ``stalling_cli.py`` hang at ``point`` of the save of ``step``."""
    return {"RECIPES_TEST_STALL": f"{point}:{step}:{marker}"}


def wait_and_kill_at_stall(process: Any, marker: Path) -> None:
    wait_until(marker.exists, process)
    kill_hard(process)


def list_names(paths: Sequence[Path]) -> list[str]:
    return sorted(p.name for p in paths)
