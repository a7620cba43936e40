"""Fixtures that tests of both trees use, beyond tests/conftest.py's: recipes of the tests' own, registered in an
isolated working directory, and the plugin package's data format. tests/conftest.py loads this module as a plugin."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from recsys.tabular.formats import DATA_FORMATS
from support.paths import PLUGIN_PACKAGE
from support.two_tables import register_two_tables
from support.zoo_data import register_zoo_recipe


@pytest.fixture
def two_tables(isolated_presets: Path) -> Path:
    """``isolated_presets`` with the recipe and preset ``two_tables`` registered (see ``support/two_tables.py``)."""
    register_two_tables()
    return isolated_presets


@pytest.fixture
def zoo_recipe(isolated_presets: Path) -> Path:
    """``isolated_presets`` with the recipe and preset ``zoo_test`` registered (see ``support/zoo_data.py``)."""
    register_zoo_recipe()
    return isolated_presets


@pytest.fixture
def plugin_folder(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The plugin package importable from its folder, not installed; afterwards its modules are forgotten and the
    data formats are the built-in ones again, so that no other test sees it."""
    monkeypatch.syspath_prepend(str(PLUGIN_PACKAGE))
    monkeypatch.setattr(DATA_FORMATS, "_components", dict(DATA_FORMATS._components))
    yield
    for name in [name for name in sys.modules if name.split(".")[0] == "recipes_plugin"]:
        del sys.modules[name]


@pytest.fixture
def plugin(plugin_folder: None) -> ModuleType:
    """The plugin's module, imported: its decorator registers ``jsonl``."""
    return importlib.import_module("recipes_plugin.jsonl")
