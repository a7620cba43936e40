"""Recipes by name, and presets (named configs of a recipe) from YAML files and Python.

Installed packages (the built-in recipes among them) offer recipes and presets through two
entry-point groups, so the framework names none of them:

- ``recipes.recipes``: a recipe name -> the module that registers it, imported when the name is
  first looked up;
- ``recipes.presets``: a name -> a package holding a ``presets.yaml``.

Presets are looked up in, from lowest to highest precedence: the installed packages' files, the
files named in ``$RECIPES_PRESET_FILES`` (separated by ``os.pathsep``), a ``recipes.yaml`` in the
current directory, and presets registered from Python. A preset may be ``based_on`` another and
may name ``imports``: modules imported before its recipe is looked up, from the preset file's
folder (and the folders its ``search_path`` names), so that a user's recipe registers itself. A
run's ``config.yaml`` records the folders its imports came from as an absolute ``search_path``,
so that it re-runs from any directory.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.metadata
import importlib.resources
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from recipes.config.sections import RecipeConfig
from recipes.config.text import load_yaml, read_yaml_file
from recipes.errors import UserError, closest
from recipes.runtime.shadowing import refuse_shadowing_modules

RECIPE_ENTRY_POINTS = "recipes.recipes"
PRESET_ENTRY_POINTS = "recipes.presets"
PRESET_FILE_NAME = "presets.yaml"
PRESET_FILES_ENV = "RECIPES_PRESET_FILES"
PRESET_KEYS = {"recipe", "description", "based_on", "imports", "search_path", "config", "sweep"}

BuilderT = TypeVar("BuilderT", bound=Callable[..., Any])


@dataclass(frozen=True)
class Recipe:
    """A way to train: its config class and the function that builds its parts from a config."""

    name: str
    config_class: type[RecipeConfig]
    build: Callable[..., Any]
    description: str


@dataclass(frozen=True)
class Preset:
    """A named config for a recipe; ``config`` holds only what differs from its base."""

    name: str
    recipe: str | None
    config: Mapping[str, Any]
    description: str = ""
    based_on: str | None = None
    imports: tuple[str, ...] = ()
    source: str = "python"
    search_path: tuple[str, ...] = field(default=())
    """Folders put first on ``sys.path`` for ``imports``, the first first; absolute."""
    sweep: Mapping[str, Any] | None = None
    """The search space of ``sweep`` (config keys to ranges, checked by it), which a preset ``based_on`` this one
    inherits unless it declares its own; no part of the config."""


_recipes: dict[str, Recipe] = {}
_python_presets: dict[str, Preset] = {}


def register_recipe(
    name: str, config_class: type[RecipeConfig], description: str = ""
) -> Callable[[BuilderT], BuilderT]:
    """Decorate a builder function ``build(context) -> RecipeParts`` to register it as recipe ``name``."""
    if not issubclass(config_class, RecipeConfig):
        raise TypeError(f"`config_class` must subclass RecipeConfig, but is {config_class.__name__} instead.")

    def decorate(build: BuilderT) -> BuilderT:
        _recipes[name] = Recipe(name, config_class, build, description or (build.__doc__ or "").strip())
        return build

    return decorate


def register_preset(
    name: str,
    recipe: str,
    config: Mapping[str, Any] | None = None,
    description: str = "",
    based_on: str | None = None,
) -> None:
    """Register a preset from Python; it takes precedence over YAML presets of the same name."""
    _python_presets[name] = Preset(name, recipe, dict(config or {}), description, based_on)


def get_recipe(name: str, imports: Sequence[str] = ()) -> Recipe:
    """The recipe registered as ``name``, importing the installed module that offers it if need be; ``imports``,
    the modules a preset imported before, say where else it was looked for."""
    if name not in _recipes:
        installed = _installed(RECIPE_ENTRY_POINTS)
        if name in installed:
            _import_entry_point(installed[name])
    try:
        return _recipes[name]
    except KeyError:
        known = set(_recipes) | set(_installed(RECIPE_ENTRY_POINTS))
        raise UserError(f"Unknown recipe '{name}'.{closest(name, known)} {_why_unknown(name, imports)}") from None


def _why_unknown(name: str, imports: Sequence[str]) -> str:
    """The likely cause of an unknown recipe: a module was imported that registers none of that name (its builder
    lacks the decorator), or none was (the preset lacks ``imports:``)."""
    if imports:
        return (
            f"The preset imports {', '.join(imports)}, but no module registered a recipe '{name}': decorate its "
            f'build function with `@register_recipe("{name}", ...)`.'
        )
    return (
        f"No installed package offers it, and the preset imports no module: name the module that registers it in "
        f"the preset's `imports:` (e.g. `imports: [my_{name}]` for my_{name}.py beside the preset file)."
    )


def all_presets() -> dict[str, Preset]:
    """Every preset, by name, the highest-precedence source winning."""
    presets: dict[str, Preset] = {}
    for entry_point in _installed(PRESET_ENTRY_POINTS).values():
        presets.update(_read_package_presets(entry_point))
    extra_files = [p for p in os.environ.get(PRESET_FILES_ENV, "").split(os.pathsep) if p]
    seen: set[Path] = set()
    for path in [*map(Path, extra_files), Path.cwd() / "recipes.yaml"]:
        if path.resolve() not in seen:
            seen.add(path.resolve())
            presets.update(_read_preset_file(path, required=str(path) in extra_files))
    presets.update(_python_presets)
    return presets


def find_preset(name_or_path: str) -> Preset:
    """The preset of that name, or the single preset in that YAML file (e.g. a run's ``config.yaml``)."""
    if name_or_path.endswith((".yaml", ".yml")) or os.sep in name_or_path:
        return _read_single_preset(Path(name_or_path))
    presets = all_presets()
    try:
        return presets[name_or_path]
    except KeyError:
        hint = closest(name_or_path, presets, n=3)
        raise UserError(f"Unknown preset '{name_or_path}'.{hint} (`python -m recipes list` shows them all.)") from None


def resolve_preset(preset: Preset) -> tuple[Recipe, list[tuple[str, Mapping[str, Any]]]]:
    """The preset's recipe, and its config layers from its farthest base to itself.

    Imports named by any preset in the chain happen first, with the preset file's folder on
    ``sys.path``, so the recipe can come from the user's own module.
    """
    chain = preset_chain(preset)
    for link in reversed(chain):
        _import_modules(link)
    recipe_name = next((p.recipe for p in chain if p.recipe is not None), None)
    if recipe_name is None:
        raise UserError(f"Preset '{preset.name}' ({preset.source}) must name a `recipe`, but none in its chain does.")
    layers = [(f"preset '{p.name}' ({p.source})", p.config) for p in reversed(chain)]
    return get_recipe(recipe_name, [module for link in reversed(chain) for module in link.imports]), layers


def preset_chain(preset: Preset) -> list[Preset]:
    """The preset and its ``based_on`` bases, nearest first."""
    chain = [preset]
    while chain[-1].based_on is not None:
        base_name = chain[-1].based_on
        if any(p.name == base_name for p in chain):
            names = " -> ".join([p.name for p in chain] + [base_name])
            raise UserError(f"Preset inheritance must not loop, but does: {names}.")
        chain.append(find_preset(base_name))
    return chain


def recorded_imports(preset: Preset) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What a resolved config must record to import its recipe again from any directory: the
    imports of the whole chain (farthest base first), and the folders of the chain's search paths
    they were imported from, absolute. Only those folders: the folder of a re-run ``config.yaml``
    (the output directory) holds no module, and recording it would change the file at each re-run.
    Call it after ``resolve_preset``, which imports them."""
    chain = list(reversed(preset_chain(preset)))
    imports = tuple(dict.fromkeys(module for link in chain for module in link.imports))
    candidates = {os.path.realpath(folder) for link in chain for folder in link.search_path}
    folders = [_import_root(module) for module in imports]
    return imports, tuple(dict.fromkeys(f for f in folders if f is not None and f in candidates))


def _import_root(module: str) -> str | None:
    """The ``sys.path`` folder an imported module came from (``a/b/c.py`` for ``b.c`` -> ``a``)."""
    file = getattr(sys.modules.get(module), "__file__", None)
    if file is None:
        return None
    depth = module.count(".") + (2 if Path(file).name == "__init__.py" else 1)
    return os.path.realpath(Path(file).parents[depth - 1])


def _import_modules(preset: Preset) -> None:
    refuse_shadowing_modules(preset.search_path)
    for folder in reversed(preset.search_path):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    for module in preset.imports:
        try:
            importlib.import_module(module)
        except ImportError as ex:
            raise UserError(f"Preset '{preset.name}' ({preset.source}) imports '{module}', which fails: {ex}") from None


def _installed(group: str) -> dict[str, importlib.metadata.EntryPoint]:
    """The entry points of ``group`` by name, in a stable order (sorted by package, then name)."""
    entry_points = sorted(importlib.metadata.entry_points(group=group), key=lambda ep: (ep.value, ep.name))
    return {ep.name: ep for ep in entry_points}


def _import_entry_point(entry_point: importlib.metadata.EntryPoint) -> None:
    try:
        importlib.import_module(entry_point.module)
    except ImportError as ex:
        raise UserError(
            f"The installed entry point '{entry_point.name} = {entry_point.value}' ({entry_point.group}) "
            f"fails to import: {ex}"
        ) from None


def _read_package_presets(entry_point: importlib.metadata.EntryPoint) -> dict[str, Preset]:
    """The presets in the ``presets.yaml`` of an installed package; its folder is not put on ``sys.path``."""
    _import_entry_point(entry_point)
    resource = importlib.resources.files(entry_point.module).joinpath(PRESET_FILE_NAME)
    if not resource.is_file():
        raise UserError(
            f"The installed package {entry_point.module} (entry point '{entry_point.name}' of {entry_point.group}) "
            f"must hold a {PRESET_FILE_NAME}, but does not."
        )
    source = f"{entry_point.module}/{PRESET_FILE_NAME}"
    data = _parse_yaml(resource.read_text(), source) or {}
    return _parse_preset_file(data, source, search_path=())


def _parse_yaml(text: str, source: str) -> Any:
    try:
        return load_yaml(text)
    except yaml.YAMLError as ex:
        raise _not_yaml(source, ex) from None


def _read_yaml(path: Path) -> Any:
    try:
        return read_yaml_file(path)
    except yaml.YAMLError as ex:
        raise _not_yaml(str(path), ex) from None


def _not_yaml(source: str, ex: yaml.YAMLError) -> UserError:
    return UserError(f"The preset file {source} is not valid YAML: {ex}".replace("\n", " "))


def _read_preset_file(path: Path, required: bool) -> dict[str, Preset]:
    if not path.is_file():
        if required:
            raise UserError(f"The preset file {path} named in ${PRESET_FILES_ENV} does not exist.")
        return {}
    return _parse_preset_file(_read_yaml(path) or {}, str(path), search_path=(str(path.resolve().parent),))


def _parse_preset_file(data: Any, source: str, search_path: tuple[str, ...]) -> dict[str, Preset]:
    if not isinstance(data, dict):
        raise UserError(
            f"The preset file {source} must map preset names to presets, but holds a {type(data).__name__}."
        )
    return {name: _parse_preset(str(name), body, source, search_path) for name, body in data.items()}


def _read_single_preset(path: Path) -> Preset:
    if not path.is_file():
        raise UserError(f"The preset file {path} does not exist.")
    data = _read_yaml(path)
    if not isinstance(data, dict) or ("recipe" not in data and "based_on" not in data):
        raise UserError(f"The preset file {path} must hold one preset with a `recipe` key, but does not.")
    return _parse_preset(path.stem, data, str(path), search_path=(str(path.resolve().parent),))


def _parse_preset(name: str, body: Any, source: str, search_path: tuple[str, ...]) -> Preset:
    where = f"{source}, preset '{name}'"
    if not isinstance(body, dict):
        raise UserError(f"A preset must be a mapping, but '{name}' in {source} is a {type(body).__name__}.")
    unknown = set(body) - PRESET_KEYS
    if unknown:
        key = sorted(unknown)[0]
        raise UserError(f"Unknown preset key '{key}' ({where}).{closest(key, PRESET_KEYS)}")
    config = body.get("config") or {}
    imports = body.get("imports") or []
    folders = body.get("search_path") or []
    if not isinstance(config, dict):
        raise UserError(f"The `config` of a preset must be a mapping ({where}).")
    if not isinstance(imports, list) or not all(isinstance(m, str) for m in imports):
        raise UserError(f"The `imports` of a preset must be a list of module names ({where}).")
    if not isinstance(folders, list) or not all(isinstance(f, str) for f in folders):
        raise UserError(f"The `search_path` of a preset must be a list of folders ({where}).")
    # Relative folders are relative to the preset file's, like its imports.
    base = Path(search_path[0]) if search_path else Path.cwd()
    declared = tuple(str((base / os.path.expanduser(f)).resolve()) for f in folders)
    return Preset(
        name=name,
        recipe=body.get("recipe"),
        config=config,
        description=str(body.get("description") or ""),
        based_on=body.get("based_on"),
        imports=tuple(imports),
        source=source,
        search_path=tuple(dict.fromkeys((*declared, *search_path))),
        sweep=body.get("sweep"),
    )
