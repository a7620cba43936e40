"""The import rules of docs/architecture.md, where the contracts cannot check them: every package of `src/` is
in the layers, no framework module names a built-in recipe, no module imports itself back through a cycle,
and modules stay short. `lint-imports` itself, on the tree and on copies that break each contract, runs in
tests/integration/test_architecture.py."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import grimp
import tomllib

from support.paths import ROOT, SRC

PACKAGES = ("recsys", "recipes", "units", "gang", "checkpoint", "embedding", "components")
MAX_MODULE_LINES = 500


def contracts() -> list[dict[str, object]]:
    with open(ROOT / "pyproject.toml", "rb") as file:
        return list(tomllib.load(file)["tool"]["importlinter"]["contracts"])


def test_every_package_of_src_is_in_the_layers() -> None:
    packages = {path.parent.name for path in SRC.glob("*/__init__.py")}
    layers = next(c for c in contracts() if c["name"] == "Packages import downwards")["layers"]
    layered = {name.strip() for layer in layers for name in str(layer).split("|")}  # type: ignore[attr-defined]

    assert packages == set(PACKAGES) == layered


def test_every_room_of_the_framework_is_in_its_layers() -> None:
    rooms = {path.stem for path in (SRC / "recipes").glob("*.py")} | {
        path.parent.name for path in (SRC / "recipes").glob("*/__init__.py")
    }
    layers = next(c for c in contracts() if c["name"] == "The framework's rooms import downwards")["layers"]
    layered = {name.strip() for layer in layers for name in str(layer).split("|")}  # type: ignore[attr-defined]

    assert rooms - {"__init__"} == layered


def test_no_framework_module_names_a_built_in_recipe() -> None:
    # The content package's name alone is allowed: the framework guards it from being shadowed.
    names = [r"recsys\.\w+", *(re.escape(ep.name) for ep in importlib.metadata.entry_points(group="recipes.recipes"))]
    pattern = re.compile(r"\b(" + "|".join(names) + r")\b")
    files = list((SRC / "recipes").rglob("*.py"))

    mentions = {module_name(p): pattern.findall(p.read_text()) for p in files}

    assert {module: found for module, found in mentions.items() if found} == {}


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
