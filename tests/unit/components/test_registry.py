"""Every kind of named component is a folder found by importing it: a module there registers its components by
decorator, and nothing else names it; the built-in components of a kind are those its folder's modules register."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path

import pytest

from components import Registry
from embedding import EVICTION_POLICIES, SPARSE_OPTIMIZERS
from recipes.lr_schedules import LR_SCHEDULES
from recipes.optimizers import OPTIMIZERS
from recipes.recorders import RECORDERS
from recsys.tabular.formats import DATA_FORMATS
from recsys.zoo import ZOO_MODELS

KINDS = [
    (OPTIMIZERS, "recipes.optimizers"),
    (LR_SCHEDULES, "recipes.lr_schedules"),
    (RECORDERS, "recipes.recorders"),
    (ZOO_MODELS, "recsys.zoo"),
    (DATA_FORMATS, "recsys.tabular.formats"),
    (SPARSE_OPTIMIZERS, "embedding.optimizers"),
    (EVICTION_POLICIES, "embedding.eviction"),
]


@pytest.mark.parametrize(("registry", "package"), KINDS, ids=[package for _, package in KINDS])
def test_a_kind_is_a_folder_whose_modules_its_import_loads(registry: Registry[object], package: str) -> None:
    folder = importlib.import_module(package)
    modules = [f"{package}.{module.name}" for module in pkgutil.iter_modules(folder.__path__)]

    assert [module for module in modules if module not in sys.modules] == []
    assert registry.registered_by(package), f"no {registry.kind} of {package} registered"


TOY_REGISTRY = """from dataclasses import dataclass

from components import Registry


@dataclass
class ToyConfig:
    name: str = ""


TOYS = Registry("toy", "tests.toys", ToyConfig)
"""


def toy(name: str) -> str:
    """A module that registers the toy ``name``."""
    return f"from toy_registry import TOYS\n\n\n@TOYS.register({name!r})\ndef {name}(config): ...\n"


def test_the_components_a_folder_registers_are_apart_from_another_package_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "toy_registry.py").write_text(TOY_REGISTRY)
    (tmp_path / "other_toys.py").write_text(toy("yoyo"))
    folder = tmp_path / "toys"
    folder.mkdir()
    (folder / "__init__.py").write_text("import components\n\ncomponents.import_submodules(__name__, __path__)\n")
    (folder / "kite.py").write_text(toy("kite"))
    (folder / "ball.py").write_text(toy("ball"))
    monkeypatch.syspath_prepend(str(tmp_path))
    for module in ("toy_registry", "toys", "toys.ball", "toys.kite", "other_toys"):
        monkeypatch.delitem(sys.modules, module, raising=False)

    importlib.import_module("other_toys")
    importlib.import_module("toys")
    toys = importlib.import_module("toy_registry").TOYS

    assert toys.names() == ["ball", "kite", "yoyo"]
    assert toys.registered_by("toys") == ["ball", "kite"]  # In the order the folder's modules load.
    assert toys.registered_by("toy") == []  # A package by its whole name, not a prefix of it.
