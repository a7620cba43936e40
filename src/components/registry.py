"""A registry of the components of one kind, filled by decorators and by installed packages.

A component is a name, the dataclass that configures it (a ``name`` field first, then its own
options) and what the kind's user needs of it: a factory, a spec. It registers where it is
defined::

    @OPTIMIZERS.register("adamw", AdamWConfig)
    def adamw(config: AdamWConfig, params: Iterable[Parameter]) -> Optimizer: ...

and another package offers its own through the kind's entry-point group, ``my_sgd =
"my_package.optimizers"`` under ``[project.entry-points."recipes.optimizers"]``: the module is
imported when the name is first looked up, and registers it the same way (an entry point may
also name a ``Component`` object, ``"my_package.optimizers:MY_SGD"``). Nothing is imported for
names that are never asked for.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.metadata
import pkgutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from components.ranges import declared_ranges

T = TypeVar("T")


class RegistryError(LookupError):
    """A name no component has, or a component that cannot be registered or loaded."""

    def __init__(self, message: str, known: list[str] | None = None) -> None:
        super().__init__(message)
        self.known = known or []


@dataclass(frozen=True)
class Component(Generic[T]):
    """A registered component: its name, its config dataclass and what the registry keeps for it."""

    name: str
    config_class: type[Any]
    value: T

    def default_config(self) -> Any:
        """The component's config with every option at its default."""
        return self.config_class(name=self.name)


class Registry(Generic[T]):
    """The components of one kind, by name.

    ``config_base`` is the dataclass every component's config derives from: it holds the
    ``name`` and what all components of the kind share (an optimizer's ``lr``), so that code
    which handles any of them reads those fields without knowing which one it has.
    """

    def __init__(self, kind: str, entry_point_group: str, config_base: type[Any]) -> None:
        if not _has_name_field(config_base):
            raise TypeError(f"`config_base` must be a dataclass with a `name` field, but {config_base} is not.")
        self.kind = kind
        self.entry_point_group = entry_point_group
        self.config_base = config_base
        self._components: dict[str, Component[T]] = {}

    def register(self, name: str, config_class: type[Any] | None = None) -> Callable[[T], T]:
        """A decorator that registers what it decorates as component ``name``, configured by
        ``config_class`` (default: the kind's ``config_base``)."""

        def decorate(value: T) -> T:
            self.add(name, config_class or self.config_base, value)
            return value

        return decorate

    def add(self, name: str, config_class: type[Any], value: T) -> Component[T]:
        if not name or not isinstance(name, str):
            raise RegistryError(f"A {self.kind}'s name must be a non-empty string, but is {name!r} instead.")
        if not (isinstance(config_class, type) and issubclass(config_class, self.config_base)):
            raise RegistryError(
                f"The config of {self.kind} '{name}' must be a dataclass deriving from "
                f"{self.config_base.__name__}, but is {config_class!r} instead."
            )
        existing = self._components.get(name)
        if existing is not None and _origin(existing.value) != _origin(value):
            raise RegistryError(
                f"{self.kind.capitalize()} '{name}' is registered twice: by {_origin(existing.value)} "
                f"and by {_origin(value)}."
            )
        component = Component(name, config_class, value)
        self._components[name] = component
        return component

    def get(self, name: str) -> Component[T]:
        """The component ``name``, importing the installed package that offers it if need be."""
        if name not in self._components:
            self._load_entry_point(name)
        try:
            return self._components[name]
        except KeyError:
            known = self.names()
            hint = difflib.get_close_matches(name, known, n=1)
            raise RegistryError(
                f"There is no {self.kind} named '{name}'; the {self.kind}s are {', '.join(known) or 'none'}."
                + (f" Did you mean '{hint[0]}'?" if hint else ""),
                known,
            ) from None

    def default(self, name: str) -> Callable[[], Any]:
        """A ``default_factory`` for a config field choosing ``name`` with its default options."""
        return lambda: self.get(name).default_config()

    def check_config(self, config: Any, error: type[Exception]) -> None:
        """Raise ``error`` unless ``config`` configures a registered component with its own class and every
        number within its declared range: for configs built in Python, which the framework's config
        resolution (it checks the same) never sees."""
        if config.name not in self:
            raise error(f"The {self.kind} must be one of {', '.join(self.names())}, but is {config.name!r} instead.")
        config_class = self.get(config.name).config_class
        if type(config) is not config_class:
            raise error(
                f"The config of {self.kind} '{config.name}' must be of class {config_class.__name__}, but is of "
                f"class {type(config).__name__} instead."
            )
        for option, (kind, declared) in declared_ranges(config_class).items():
            value = getattr(config, option)
            if not declared.contains(value):
                raise error(
                    f"`{option}` of {self.kind} '{config.name}' must be {declared.describe(kind)}, but is {value!r} "
                    "instead."
                )

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self._components or name in self._installed())

    def registered_by(self, package: str) -> list[str]:
        """The names of the components the modules of ``package`` registered, in the order they did: a kind's
        built-in components, which its folder registers as it loads, apart from any other package's."""
        return [
            name
            for name, component in self._components.items()
            if _module(component.value) == package or _module(component.value).startswith(package + ".")
        ]

    def names(self) -> list[str]:
        """Every name: registered ones, and those installed packages offer (not imported yet)."""
        return sorted(set(self._components) | set(self._installed()))

    def _installed(self) -> dict[str, importlib.metadata.EntryPoint]:
        points = sorted(importlib.metadata.entry_points(group=self.entry_point_group), key=lambda ep: ep.value)
        return {point.name: point for point in points}

    def _load_entry_point(self, name: str) -> None:
        point = self._installed().get(name)
        if point is None:
            return
        where = f"The installed entry point '{point.name} = {point.value}' ({self.entry_point_group})"
        try:
            loaded = point.load()
        except Exception as ex:
            raise RegistryError(f"{where} fails to load: {type(ex).__name__}: {ex}") from ex
        if isinstance(loaded, Component) and name not in self._components:
            if loaded.name != name:
                raise RegistryError(f"{where} names a {self.kind} called '{loaded.name}', not '{name}'.")
            self.add(loaded.name, loaded.config_class, loaded.value)
        if name not in self._components:
            raise RegistryError(f"{where} registers no {self.kind} named '{name}'.")


def import_submodules(package: str, path: Iterable[str]) -> None:
    """Import every module of a package's folder: built-in components register as their module loads,
    so a new one is a new module and nothing else."""
    for module in pkgutil.iter_modules(path):
        importlib.import_module(f"{package}.{module.name}")


def _has_name_field(config_class: type[Any]) -> bool:
    return dataclasses.is_dataclass(config_class) and any(f.name == "name" for f in dataclasses.fields(config_class))


def _module(value: object) -> str:
    """The module that defined a value."""
    return getattr(value, "__module__", None) or type(value).__module__


def _origin(value: object) -> str:
    """Where a value was defined: a module reloaded registers the same names again, which is no clash."""
    qualname = getattr(value, "__qualname__", None) or type(value).__qualname__
    return f"{_module(value)}.{qualname}"
