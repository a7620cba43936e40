"""The import contracts of docs/architecture.md hold on the tree and would catch a break: `lint-imports`, run
as scripts/test.sh runs it, passes on `src/` and fails on a copy of it with one violating import per contract."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.paths import ROOT, SRC


def lint_imports(src: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` over the packages in ``src``, with the project's contracts."""
    return subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports")), "--no-logo", "--no-cache", "--config", "pyproject.toml"],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(src)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def src_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "src"
    shutil.copytree(SRC, copy, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return copy


def test_the_contracts_hold_on_the_tree() -> None:
    result = lint_imports(SRC)

    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("gang/fake.py", "import recipes", "Packages import downwards"),
        ("units/metrics.py", "import embedding", "Packages import downwards"),
        ("recipes/training/trainer.py", "import recsys.builtin.ctr.recipe", "Packages import downwards"),
        ("recipes/cli/train.py", "import recsys.click.models", "Packages import downwards"),
        ("recipes/config/sections.py", "import recipes.training.trainer", "The framework's rooms import downwards"),
        ("recipes/training/trainer.py", "import recipes.cli.job", "The framework's rooms import downwards"),
        ("recipes/runtime/threads.py", "import recipes.config.resolution", "The framework's rooms import downwards"),
        ("recsys/click/units.py", "import recipes.training.trainer", "Content imports only the framework's public API"),
        (
            "recsys/tabular/hashing.py",
            "from embedding.id_hashing import mix64",
            "Content imports only the embedding package's public API",
        ),
        ("recsys/models/mlp.py", "import recsys.builtin.dlrm", "Content builds upwards"),
        ("recsys/click/batch.py", "import recsys.tabular.schema", "Content builds upwards"),
        ("recsys/builtin/ctr/recipe.py", "import recsys.builtin.dlrm.criteo", "Built-in recipes are independent"),
    ],
)
def test_a_violating_import_breaks_its_contract(src_copy: Path, module: str, line: str, contract: str) -> None:
    path = src_copy / module
    path.write_text(path.read_text() + f"\n{line}  # noqa\n")

    result = lint_imports(src_copy)

    assert result.returncode == 1
    broken = [row for row in result.stdout.splitlines() if row.endswith("BROKEN")]
    assert any(row.startswith(contract) for row in broken), result.stdout
