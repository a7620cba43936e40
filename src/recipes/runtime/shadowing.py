"""A user's module named like a framework package hides it: found before the first import, where it still can be.

Kept apart from the registry, which imports torch: ``python -m recipes`` checks this first of all.

One such module is caught before even this: a ``recipes.py`` (or ``recipes/`` package) in the folder where
``python -m recipes`` runs is what ``-m`` finds and runs, before any of the framework's code; the guard in
src/recipes_launch_guard.py, run by Python's start-up, refuses it, and the ``recipes`` command refuses it here.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
from collections.abc import Sequence
from pathlib import Path

from recipes.errors import UserError
from recipes_launch_guard import hidden_package_message

# The framework's top-level packages, which a user's module of the same name would hide.
FRAMEWORK_PACKAGES = ("recipes", "recsys", "units", "checkpoint", "gang", "embedding", "components")
_FRAMEWORK_ROOT = Path(__file__).resolve().parents[2]  # src/, above recipes/runtime/


def refuse_shadowing_modules(folders: Sequence[str] | None = None) -> None:
    """A user's module named like a framework package (``units.py`` beside a recipe) hides it: from
    the current directory, ``python -m recipes`` itself imports the user's file and fails far from
    the cause; from a preset's folder, the user's own ``import units`` gets the framework's package.
    Either way, one line saying what to rename. ``folders``: check those (a preset's search path);
    ``None``: check where the framework packages will be imported from now."""
    for name in FRAMEWORK_PACKAGES:
        if folders is None:
            origins = [_origin(importlib.util.find_spec(name))]
        else:
            origins = [_origin(importlib.machinery.PathFinder.find_spec(name, [folder])) for folder in folders]
        for origin in origins:
            if origin is not None and not origin.is_relative_to(_FRAMEWORK_ROOT):
                raise UserError(hidden_package_message(origin, name))


def _origin(spec: importlib.machinery.ModuleSpec | None) -> Path | None:
    """Where a module or regular package of that spec lives; ``None`` for a namespace folder, which hides
    nothing that is found anywhere on the path."""
    if spec is None or spec.origin is None or not spec.has_location:
        return None
    origin = Path(spec.origin).resolve()
    return origin.parent if origin.name == "__init__.py" else origin
