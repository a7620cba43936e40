"""``sweep`` as a user runs it: real processes, ctr_tiny cut to 10 steps a trial.

A sweep over a planted optimum finds it and leaves its results (table, CSV, Parquet, HParams, a ``best.yaml`` that
trains to the same score); a sweep killed with SIGKILL resumes without repeating a finished trial; two trials in
parallel equal the same trials one after the other."""

from __future__ import annotations

import csv
import fcntl
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from statistics import median
from typing import Any

import pyarrow.parquet as pq
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from support.doc_blocks import blocks, commands
from support.paths import ROOT

TINY = [
    "trainer.max_num_steps=10",
    "trainer.validate_every_n_steps=5",
    "dataset.num_train_samples=1024",
    "dataset.num_valid_samples=512",
    "metrics.recorders.console=false",
    "gang.threads_per_rank=1",
]
# Only the dense part learns at all (its sparse tables' lr is tiny): a dense lr far below 1e-4 learns nothing in 10
# steps, so the trials above it win.
PLANTED = "optimizer.lr: {log_uniform: [1.0e-7, 0.1]}\n"
WINNING_LR = 1.0e-4


def results(sweep_dir: Path) -> list[dict[str, str]]:
    with open(sweep_dir / "results.csv") as f:
        return list(csv.DictReader(f))


def best_valid_auc(run_dir: Path) -> float:
    with open(run_dir / "metrics" / "valid.jsonl") as f:
        return max(json.loads(line)["auc"] for line in f if line.strip())


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory, run_cli: Any) -> tuple[Path, Any]:
    cwd = tmp_path_factory.mktemp("sweep")
    (cwd / "space.yaml").write_text(PLANTED)
    args = ["sweep", "ctr_tiny", "-o", "out", "--trials", "4", "--space", "space.yaml", "--prune-after", "1", *TINY]
    return cwd, run_cli(*args, "model.embeddings.sparse_optimizer.lr=1.0e-6", cwd=cwd)


def test_a_sweep_over_a_planted_optimum_finds_it(planted: tuple[Path, Any]) -> None:
    cwd, result = planted
    assert result.returncode == 0, result.stderr
    rows = results(cwd / "out")

    lrs = {int(row["trial"]): float(row["optimizer.lr"]) for row in rows}
    scores = {int(row["trial"]): float(row["score"]) for row in rows}
    best = max(scores, key=lambda n: scores[n])
    assert rows[0]["state"] == "complete" and {row["state"] for row in rows} <= {"complete", "pruned"}
    assert any(lr < WINNING_LR for lr in lrs.values()) and any(lr >= WINNING_LR for lr in lrs.values()), lrs
    assert lrs[best] >= WINNING_LR, (lrs, scores)
    assert all(scores[n] < scores[best] for n in lrs if lrs[n] < WINNING_LR)
    assert f"Best: trial {best}, auc=" in result.stdout


def valid_aucs(run_dir: Path) -> dict[int, float]:
    with open(run_dir / "metrics" / "valid.jsonl") as f:
        return {row["step"]: row["auc"] for row in map(json.loads, filter(str.strip, f))}


def test_a_trial_below_the_median_of_the_trials_before_it_is_pruned_at_that_validation(
    planted: tuple[Path, Any],
) -> None:
    """The rule, checked against the trials' own validations: at each validation, a trial whose best AUC so far is
    below the median of the earlier complete trials' AUCs at that step stops there (one trial at a time: every
    earlier trial had ended when it started)."""
    cwd, _ = planted
    rows = results(cwd / "out")
    aucs = {int(row["trial"]): valid_aucs(Path(row["run_dir"])) for row in rows}

    for row in rows:
        number = int(row["trial"])
        earlier = [aucs[int(r["trial"])] for r in rows if r["state"] == "complete" and int(r["trial"]) < number]
        expected = next(
            (
                step
                for step in (5, 10)
                if earlier and max(v for s, v in aucs[number].items() if s <= step) < median(e[step] for e in earlier)
            ),
            None,
        )
        outcome = json.loads((Path(row["run_dir"]) / "sweep_trial.json").read_text())
        assert row["state"] == ("pruned" if expected is not None else "complete"), (row, aucs)
        assert max(aucs[number]) == (expected or 10)
        assert (Path(row["run_dir"]) / "checkpoints" / f"step_{expected or 10}").is_dir()
        assert outcome["state"] == row["state"]
    assert any(row["state"] == "pruned" for row in rows), rows


def test_each_trial_is_a_run_and_the_results_are_a_table_csv_parquet_and_hparams(planted: tuple[Path, Any]) -> None:
    cwd, result = planted
    out = cwd / "out"
    rows = results(out)

    assert "trial  state     auc       optimizer.lr  run_dir" in result.stdout
    for row in rows:
        run_dir = Path(row["run_dir"])
        assert run_dir == out.resolve() / f"trial_{int(row['trial']):04d}"
        assert (run_dir / "config.yaml").is_file() and (run_dir / "checkpoints").is_dir()
        assert float(row["score"]) == pytest.approx(best_valid_auc(run_dir), abs=0)
    parquet = pq.read_table(out / "results.parquet").to_pylist()
    assert [r["score"] for r in parquet] == [float(row["score"]) for row in rows]
    events = EventAccumulator(str(out / "hparams" / "trial_0000"))
    events.Reload()
    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    session = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    assert session.hparams["optimizer.lr"].number_value == pytest.approx(float(rows[0]["optimizer.lr"]))
    assert events.Scalars("auc")[0].value == pytest.approx(float(rows[0]["score"]))


def test_best_yaml_is_a_preset_that_train_runs_to_the_same_score(planted: tuple[Path, Any], run_cli: Any) -> None:
    cwd, _ = planted
    rows = results(cwd / "out")
    best = max(rows, key=lambda row: float(row["score"]))

    trained = run_cli("train", "out/best.yaml", "-o", "again", cwd=cwd)

    assert trained.returncode == 0, trained.stderr
    assert best_valid_auc(cwd / "again") == float(best["score"])


def _wait_unlocked(lock_file: Path, timeout_s: float = 30.0) -> None:
    """Until no process holds the run's lock: the killed sweep's trial has died with it."""
    deadline = time.monotonic() + timeout_s
    with open(lock_file, "a") as f:
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(f, fcntl.LOCK_UN)
                return
            except BlockingIOError:
                assert time.monotonic() < deadline, "the trial outlived its sweep"
                time.sleep(0.1)


def test_a_sweep_killed_with_sigkill_resumes_without_repeating_a_finished_trial(tmp_path: Path, run_cli: Any) -> None:
    (tmp_path / "space.yaml").write_text(PLANTED)
    args = ["sweep", "ctr_tiny", "-o", "out", "--trials", "3", "--space", "space.yaml", *TINY]
    first = subprocess.Popen([sys.executable, "-m", "recipes", *args], cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    assert first.stdout is not None
    seen = []
    for line in first.stdout:
        seen.append(line)
        if line.startswith("Trial 1 started"):
            break
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    assert any(line.startswith("Trial 0 complete") for line in seen), seen
    finished = (tmp_path / "out" / "trial_0000" / "sweep_trial.json").stat().st_mtime_ns
    _wait_unlocked(tmp_path / "out" / "trial_0001" / "train.lock")

    resumed = run_cli(*args, cwd=tmp_path)

    assert resumed.returncode == 0, resumed.stderr
    assert "Trial 0 started" not in resumed.stdout
    assert "Trial 1 was stopped mid-run: marked failed, and its values run again." in resumed.stdout
    assert (tmp_path / "out" / "trial_0000" / "sweep_trial.json").stat().st_mtime_ns == finished
    rows = results(tmp_path / "out")
    assert [row["state"] for row in rows] == ["complete", "killed", "complete", "complete"]
    assert rows[2]["optimizer.lr"] == rows[1]["optimizer.lr"]


def test_two_parallel_trials_equal_the_same_trials_one_after_the_other(tmp_path: Path, run_cli: Any) -> None:
    (tmp_path / "space.yaml").write_text(PLANTED)
    args = ["ctr_tiny", "--trials", "2", "--space", "space.yaml", *TINY]

    parallel = run_cli("sweep", "-o", "parallel", "--parallel", "2", *args, cwd=tmp_path)
    serial = run_cli("sweep", "-o", "serial", *args, cwd=tmp_path)

    assert parallel.returncode == 0, parallel.stderr
    assert serial.returncode == 0, serial.stderr
    drop_dir = [{k: v for k, v in row.items() if k != "run_dir"} for row in results(tmp_path / "parallel")]
    assert drop_dir == [{k: v for k, v in row.items() if k != "run_dir"} for row in results(tmp_path / "serial")]


def test_the_how_to_page_runs_as_written(tmp_path: Path, run_cli: Any) -> None:
    """docs/how-to/sweeps.md: its recipes.yaml, then each command of its block, in a folder of their own."""
    page = blocks(ROOT / "docs" / "how-to" / "sweeps.md")
    (tmp_path / "recipes.yaml").write_text(next(b for b in page if b.language == "yaml").text)
    block = next(b for b in page if b.language == "bash")

    for command in commands(block):
        args = shlex.split(command, comments=True)
        assert args[:3] == [".venv/bin/python", "-m", "recipes"], command
        result = run_cli(*args[3:], cwd=tmp_path)
        assert result.returncode == 0, (command, result.stderr)

    rows = results(tmp_path / "sweeps" / "ctr")
    assert len(rows) == 4 and {row["state"] for row in rows} <= {"complete", "pruned"}
    best = max((row for row in rows if row["state"] == "complete"), key=lambda row: float(row["score"]))
    assert best_valid_auc(tmp_path / "runs" / "ctr_best") == float(best["score"])
    assert (tmp_path / "sweeps" / "ctr" / "trial_0001.csv").is_file()


def test_a_trial_stopped_by_a_user_error_stops_the_sweep_in_one_line(tmp_path: Path, run_cli: Any) -> None:
    """The config resolves, but no trial can run it (more threads than cores): one line and exit code 2, not a
    failed trial per sample."""
    (tmp_path / "space.yaml").write_text(PLANTED)
    args = ["sweep", "ctr_tiny", "-o", "out", "--trials", "3", "--space", "space.yaml", *TINY[:-1]]

    result = run_cli(*args, "gang.threads_per_rank=100000", cwd=tmp_path)

    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: Trial 0 stopped on a user error: `gang.threads_per_rank`")
    assert [row["state"] for row in results(tmp_path / "out")] == ["failed"]


def test_ctrl_c_stops_the_running_trial_and_the_same_command_resumes(tmp_path: Path, run_cli: Any) -> None:
    (tmp_path / "space.yaml").write_text(PLANTED)
    args = ["sweep", "ctr_tiny", "-o", "out", "--trials", "1", "--space", "space.yaml", *TINY]
    first = subprocess.Popen(
        [sys.executable, "-m", "recipes", *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert first.stdout is not None
    for line in first.stdout:
        if line.startswith("Trial 0 started"):
            break
    first.send_signal(signal.SIGINT)
    _, err = first.communicate(timeout=120)

    assert first.returncode == 130
    assert err.strip() == (
        "error: the sweep was interrupted; its ended trials are kept, and the same command resumes it."
    )
    resumed = run_cli(*args, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert [row["state"] for row in results(tmp_path / "out")] == ["killed", "complete"]


def test_sweeps_of_two_directories_share_one_study_through_storage(tmp_path: Path, run_cli: Any) -> None:
    """Two machines' sweeps, one after the other here: the second runs only what the shared study lacks, in its own
    directory, and its table shows every trial."""
    (tmp_path / "space.yaml").write_text(PLANTED)
    shared = ["--storage", f"sqlite:///{tmp_path}/shared.db", "--space", "space.yaml", *TINY]

    first = run_cli("sweep", "ctr_tiny", "-o", "a", "--trials", "2", *shared, cwd=tmp_path)
    second = run_cli("sweep", "ctr_tiny", "-o", "b", "--trials", "3", *shared, cwd=tmp_path)

    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second.stderr
    assert "Trial 0 started" not in second.stdout and "Trial 2 started" in second.stdout
    rows = results(tmp_path / "b")
    assert [Path(row["run_dir"]).parent.name for row in rows] == ["a", "a", "b"]
    assert [row["state"] for row in rows] == ["complete"] * 3
    assert not (tmp_path / "a" / "study.db").exists() and not (tmp_path / "b" / "study.db").exists()
