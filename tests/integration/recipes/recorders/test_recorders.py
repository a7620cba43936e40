"""The WandB recorder, offline, in a real training: its run is written under the output directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def test_wandb_offline_writes_a_run_under_the_output_dir(tmp_path: Path, run_cli: Any) -> None:
    wandb_home = tmp_path / "wandb_home"
    env = {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(wandb_home / "dir"),
        "WANDB_CACHE_DIR": str(wandb_home / "cache"),
        "WANDB_CONFIG_DIR": str(wandb_home / "config"),
        "WANDB_DATA_DIR": str(wandb_home / "data"),
        "HOME": str(wandb_home / "home"),
    }
    result = run_cli(
        "train",
        "ctr_tiny",
        "-o",
        "out",
        "metrics.recorders.wandb.enabled=true",
        "metrics.recorders.console=false",
        "trainer.max_num_steps=10",
        "metrics.recorders.tensorboard=false",
        cwd=tmp_path,
        env=env,
    )

    assert result.returncode == 0, result.stderr
    runs = list((tmp_path / "out" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, list((tmp_path / "out").rglob("*"))
    assert list(runs[0].glob("run-*.wandb")), "the offline run holds its data file"
