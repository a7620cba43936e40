"""The import rules of docs/architecture.md hold, and would catch a break.

`lint-imports` (in scripts/test.sh) checks the contracts in pyproject.toml on the real tree. These
tests check what the contracts cannot: that they would fail on a violating import, that every
package of `src/` is in the layers, that no module imports itself back through a cycle, and that
modules stay short.
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGES = ("recsys", "recipes", "units", "gang", "checkpoint", "embedding", "components")
MAX_MODULE_LINES = 500


def contracts() -> list[dict[str, object]]:
    with open(ROOT / "pyproject.toml", "rb") as file:
        return list(tomllib.load(file)["tool"]["importlinter"]["contracts"])


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
        ("recipes/trainer.py", "import recsys.builtin.ctr.recipe", "Packages import downwards"),
        ("recipes/run.py", "import recsys.click.models", "Packages import downwards"),
        ("recsys/click/units.py", "import recipes.trainer", "Content imports only the framework's public API"),
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


def test_every_package_of_src_is_in_the_layers() -> None:
    packages = {path.parent.name for path in SRC.glob("*/__init__.py")}
    layers = next(c for c in contracts() if c["name"] == "Packages import downwards")["layers"]
    layered = {name.strip() for layer in layers for name in str(layer).split("|")}  # type: ignore[attr-defined]

    assert packages == set(PACKAGES) == layered


def test_no_framework_module_names_a_built_in_recipe() -> None:
    # The content package's name alone is allowed: the framework guards it from being shadowed.
    names = [r"recsys\.\w+", *(re.escape(ep.name) for ep in importlib.metadata.entry_points(group="recipes.recipes"))]
    pattern = re.compile(r"\b(" + "|".join(names) + r")\b")
    files = list((SRC / "recipes").rglob("*.py"))

    mentions = {module_name(p): pattern.findall(p.read_text()) for p in files}

    assert {module: found for module, found in mentions.items() if found} == {}


def within(module: str, packages: list[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_import_cycle_inside_src() -> None:
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)

    cycles = strongly_connected_components(graph)

    assert [sorted(c) for c in cycles if len(c) > 1] == []


def test_no_module_is_over_the_line_limit() -> None:
    lengths = {str(p.relative_to(SRC)): len(p.read_text().splitlines()) for p in SRC.rglob("*.py")}

    assert {path: n for path, n in lengths.items() if n > MAX_MODULE_LINES} == {}


def strongly_connected_components(graph: grimp.ImportGraph) -> list[set[str]]:
    """Tarjan's algorithm over the module import graph; a component of two or more is a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == module:
                    break
            components.append(component)

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return components
