"""Real multi-process training jobs (torchrun over gloo): DP and DP x TP equal one process, checkpoints
move between world sizes, and a dead rank brings the job down promptly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from support import warm_runs
from support.gloo_jobs import free_port

# Small enough for a 2-core machine; the global batch of 64 splits over 1, 2 or 4 ranks.
COMMON = [
    "metrics.recorders.console=false",
    "trainer.validate_every_n_steps=10",
    "dataset.num_train_samples=4096",
    "dataset.num_valid_samples=1024",
    "dataset.batch_size=64",
    "checkpoint.every_n_steps=10",
    "gang.timeout_s=60",
]


def recipes(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return warm_runs.run([sys.executable, "-m", "recipes", *args], cwd, env, timeout=300)


def train(output_dir: Path, *extra: str, nproc: int | None = None) -> None:
    launch = [] if nproc is None else ["--nproc", str(nproc)]
    result = recipes("train", "ctr_tiny", "-o", str(output_dir), *COMMON, *extra, *launch, cwd=output_dir.parent)
    assert result.returncode == 0, result.stderr[-3000:]


def final_model(output_dir: Path, step: int) -> dict[str, torch.Tensor]:
    state = torch.load(output_dir / f"checkpoints/step_{step}/model.pt", weights_only=True)
    return state["model"]


def assert_models_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5, msg=f"parameter {name} differs")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """One process, 30 steps."""
    output_dir = tmp_path_factory.mktemp("reference") / "run"
    train(output_dir, "trainer.max_num_steps=30")
    return final_model(output_dir, 30)


def test_two_process_dp_equals_one_process(tmp_path: Path, reference: dict[str, torch.Tensor]) -> None:
    output_dir = tmp_path / "dp2"
    train(output_dir, "trainer.max_num_steps=30", nproc=2)
    assert_models_close(final_model(output_dir, 30), reference)
    assert (output_dir / "logs/rank_0.log").is_file() and (output_dir / "logs/rank_1.log").is_file()
    # Only rank 0 records.
    assert len(list((output_dir / "tb/train").iterdir())) >= 1


def test_dp2_tp2_equals_one_process(tmp_path: Path, reference: dict[str, torch.Tensor]) -> None:
    output_dir = tmp_path / "dp2tp2"
    train(output_dir, "trainer.max_num_steps=30", "gang.tp_size=2", nproc=4)
    assert_models_close(final_model(output_dir, 30), reference)


def test_checkpoint_of_two_processes_resumes_on_one_and_on_four(
    tmp_path: Path, reference: dict[str, torch.Tensor]
) -> None:
    on_one, on_four = tmp_path / "on_one", tmp_path / "on_four"
    train(on_one, "trainer.max_num_steps=20", nproc=2)
    subprocess.run(["cp", "-r", str(on_one), str(on_four)], check=True)

    train(on_one, "trainer.max_num_steps=30")
    train(on_four, "trainer.max_num_steps=30", "gang.tp_size=2", nproc=4)

    assert_models_close(final_model(on_one, 30), reference)
    assert_models_close(final_model(on_four, 30), reference)


def train_on_two_nodes(output_dir: Path, *extra: str) -> None:
    """Two torchrun launchers, one process each, meeting at a rendezvous endpoint on localhost, as two
    machines of a cluster would (docs/how-to/multi-process.md)."""
    port = free_port()
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d"]
    command += ["--rdzv-endpoint", f"localhost:{port}", "--rdzv-id", "two_nodes", "-m", "recipes", "train"]
    # Both "machines" share this one's cores: one thread each, as on one machine of two ranks.
    command += ["ctr_tiny", "-o", str(output_dir), *COMMON, "gang.threads_per_rank=1", *extra]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    nodes = [
        subprocess.Popen(command, cwd=output_dir.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(2)
    ]
    for node in nodes:
        _, stderr = node.communicate(timeout=300)
        assert node.returncode == 0, stderr.decode()[-3000:]


def test_two_launchers_as_two_nodes_train_and_resume_as_one_process(
    tmp_path: Path, reference: dict[str, torch.Tensor]
) -> None:
    output_dir = tmp_path / "two_nodes"
    train_on_two_nodes(output_dir, "trainer.max_num_steps=20")
    assert sorted(p.name for p in (output_dir / "checkpoints/step_20").glob("rank_*.pt")) == ["rank_0.pt", "rank_1.pt"]

    train_on_two_nodes(output_dir, "trainer.max_num_steps=30")

    assert "Resumed from the checkpoint of step 20" in (output_dir / "logs/rank_0.log").read_text()
    assert_models_close(final_model(output_dir, 30), reference)


def test_bad_tensor_parallel_split_is_a_user_error(tmp_path: Path) -> None:
    result = recipes("train", "ctr_tiny", "-o", str(tmp_path / "bad"), "gang.tp_size=3", "--nproc", "2", cwd=tmp_path)
    assert result.returncode == 2
    assert "gang.tp_size" in result.stderr and "world size 2" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_killed_rank_brings_the_job_down_promptly(tmp_path: Path) -> None:
    output_dir = tmp_path / "killed"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "recipes", "train", "ctr_tiny", "-o", str(output_dir), *COMMON]
    # Promptly: the survivor's next collective would wait an hour for the dead rank, so a job that went down on
    # that timeout rather than on the death would still run when the test stops waiting for it.
    command += ["trainer.max_num_steps=100000", "checkpoint.every_n_steps=null", "gang.timeout_s=3600", "--nproc", "2"]
    launcher = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        rank_1_log = output_dir / "logs/rank_1.log"
        deadline = time.monotonic() + 120
        while not (rank_1_log.is_file() and "Training starts" in rank_1_log.read_text()):
            assert time.monotonic() < deadline, "the job never started training"
            assert launcher.poll() is None, launcher.communicate()[1]
            time.sleep(0.2)
        time.sleep(1.0)  # Mid-training.

        workers = subprocess.run(["pgrep", "-P", str(launcher.pid)], capture_output=True, text=True).stdout.split()
        assert len(workers) == 2, workers
        rank_1 = next(pid for pid in map(int, workers) if _rank_of(pid) == 1)
        os.kill(rank_1, signal.SIGKILL)

        _, stderr = launcher.communicate(timeout=300)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 1
    assert "rank 1 was killed by SIGKILL" in stderr


def _rank_of(pid: int) -> int:
    """The RANK that torchrun gave a worker process, read from its environment."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return int(next(v for v in environ if v.startswith(b"RANK=")).split(b"=", 1)[1])
