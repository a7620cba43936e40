"""A non-editable install works away from the checkout: the built-in presets and their data ship inside it.

The wheel is built from a copy of the project and installed, without its dependencies, into a new
virtual environment; the dependencies come from the test's own environment through a path file
(a plain path: the editable install's own path file there is not read, so the checkout's `src`
stays out of reach). Every command then runs from an empty folder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from support.paths import ROOT

LEFT_BEHIND = (".venv", ".git", "runs", "build", "dist", ".*cache*", "*.egg-info", "__pycache__")
BUILT_IN_PRESETS = ("ctr_tiny", "ctr_tiny_long", "dlrm_criteo_tiny", "dlrm_criteo", "movielens_small")


def run(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def installed_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Python of a fresh venv with the project's wheel installed (not editable)."""
    base = tmp_path_factory.mktemp("packaging")
    project = base / "project"
    shutil.copytree(
        ROOT,
        project,
        ignore=shutil.ignore_patterns(
            ".venv", ".git", "runs", "build", "dist", ".*cache*", "*.egg-info", "__pycache__"
        ),
    )
    wheels = base / "wheels"
    built = run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels), "."],
        project,
    )
    assert built.returncode == 0, built.stderr
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site_packages = Path(
        run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], base).stdout.strip()
    )
    (site_packages / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    wheel = next(wheels.glob("recipes_trainer-*.whl"))
    installed = run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)], base
    )
    assert installed.returncode == 0, installed.stderr
    shutil.rmtree(project)  # Nothing of the checkout is left to fall back on.
    return python


def test_the_package_is_imported_from_the_venv(installed_python: Path, tmp_path: Path) -> None:
    result = run([str(installed_python), "-c", "import recipes; print(recipes.__file__)"], tmp_path)

    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()).is_relative_to(installed_python.parents[1])


def test_every_built_in_preset_is_listed(installed_python: Path, tmp_path: Path) -> None:
    result = run([str(installed_python), "-m", "recipes", "list"], tmp_path)

    assert result.returncode == 0, result.stderr
    listed = {line.split()[0] for line in result.stdout.splitlines() if line.strip()}
    assert set(BUILT_IN_PRESETS) <= listed


@pytest.mark.parametrize("preset", ["ctr_tiny", "dlrm_criteo_tiny", "movielens_small"])
def test_a_built_in_preset_trains(installed_python: Path, tmp_path: Path, preset: str) -> None:
    steps = ["trainer.max_num_steps=40", "trainer.validate_every_n_steps=20", "checkpoint.every_n_steps=20"]

    result = run([str(installed_python), "-m", "recipes", "train", preset, "-o", "out", *steps], tmp_path)

    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "checkpoints" / "step_40" / "metadata.json").is_file()
    assert (tmp_path / "out" / "metrics" / "valid.jsonl").read_text().count("\n") == 2
