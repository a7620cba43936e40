"""Typed configs from layered plain dicts.

A recipe's config is a dataclass. Layers of plain dicts (a preset, config files, command line
overrides) are merged onto its defaults, key by key, each checked against the dataclass schema
as it arrives so that an error can say which key, which type and which layer. The result is
rebuilt into the dataclass, and dumps back to YAML that loads again.

Every form a field's type takes (a number with its range, an optional, a literal, a list, a
mapping, a nested section, a component chosen by name) is handled by one ``_Kind``; the table
``_KINDS`` says which, and every step (check, merge, build, list the keys) asks the kind.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

from components import (
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Range,
    Registry,
    RegistryError,
)
from recipes.config_text import dump_yaml, load_yaml, overrides_to_dict, parse_override, to_dict
from recipes.errors import ConfigError, closest
from recipes.key_hints import suggest_key

ConfigT = TypeVar("ConfigT")

__all__ = [
    "ConfigError",
    "NonNegativeFloat",
    "NonNegativeInt",
    "NumericField",
    "PositiveFloat",
    "PositiveInt",
    "Range",
    "dump_yaml",
    "load_yaml",
    "numeric_fields",
    "overrides_to_dict",
    "parse_override",
    "resolve_config",
    "to_dict",
    "valid_keys",
]


def resolve_config(config_class: type[ConfigT], layers: list[tuple[str, Mapping[str, Any]]]) -> ConfigT:
    """Merge ``layers`` (``(source, dict)``, lowest precedence first) onto the class's defaults."""
    root = _kind_of(config_class)
    merged = root.merge({}, to_dict(config_class()), _Place(root, "", f"the defaults of {config_class.__name__}"))
    for source, layer in layers:
        merged = root.merge(merged, layer, _Place(root, "", source))
    config: ConfigT = root.build(merged, "")
    return config


@dataclass(frozen=True)
class _Place:
    """Where a value being merged sits: the dotted key, the layer it came from, and the root kind
    (for suggestions that look across the whole config)."""

    root: _Kind
    key: str
    source: str
    nullable: bool = False

    def child(self, name: str) -> _Place:
        return _Place(self.root, f"{self.key}.{name}" if self.key else name, self.source)

    def type_error(self, kind: _Kind, value: Any) -> ConfigError:
        return ConfigError(
            f"Config key '{self.key}' must be {kind.describe()}, but is {value!r} ({type(value).__name__}) "
            f"instead (from {self.source})."
        )


class _Kind(ABC):
    """How the values of one form of type annotation are checked, merged and built."""

    @abstractmethod
    def matches(self, value: Any) -> bool:
        """Whether ``value`` (plain data) is of this kind, nested values included."""

    @abstractmethod
    def describe(self) -> str:
        """What a value must be, for error messages: ``an int``, ``a list of str``."""

    def coerce(self, value: Any) -> Any:
        """``value`` as this kind reads it before checking (``"inf"`` where a float goes)."""
        return value

    def merge(self, base: Any, layer: Any, at: _Place) -> Any:
        """``layer`` merged onto ``base``: for most kinds the layer replaces the base, once checked."""
        layer = self.coerce(layer)
        if not self.matches(layer):
            raise at.type_error(self, layer)
        self.check(layer, at)
        return layer

    def check(self, value: Any, at: _Place) -> None:
        """Checks beyond the type (ranges), on a value that matches."""

    def build(self, data: Any, key: str) -> Any:
        """Checked plain data rebuilt into what the config holds (dataclasses, floats)."""
        return data

    def children(self) -> Iterator[tuple[str, _Kind]]:
        """The nested keys under a value of this kind, with their kinds (none but for sections)."""
        return iter(())


class _Scalar(_Kind):
    def __init__(self, kind: type) -> None:
        self.kind = kind

    def matches(self, value: Any) -> bool:
        if self.kind is Any:
            return True
        if self.kind in (int, float) and isinstance(value, bool):
            return False
        if self.kind is float:
            return isinstance(value, (int, float))
        return isinstance(value, self.kind)

    def describe(self) -> str:
        return "null" if self.kind is type(None) else getattr(self.kind, "__name__", str(self.kind))

    def build(self, data: Any, key: str) -> Any:
        return float(data) if self.kind is float and isinstance(data, int) else data


_NON_FINITE = {"nan": math.nan, "inf": math.inf, "+inf": math.inf, "-inf": -math.inf}


class _Number(_Scalar):
    """An int or float within its declared ``Range`` (a float without one: any finite float)."""

    def __init__(self, kind: type, valid: Range | None) -> None:
        super().__init__(kind)
        self.range = valid if valid is not None or kind is int else Range()
        self.declared = valid

    def coerce(self, value: Any) -> Any:
        """``inf`` and ``nan`` typed where a float goes, as Python's ``float()`` reads them, so that they
        meet the range check (and its clear message) rather than a type error; YAML spells them ``.inf``."""
        if self.kind is float and isinstance(value, str) and value.strip().lower() in _NON_FINITE:
            return _NON_FINITE[value.strip().lower()]
        return value

    def check(self, value: Any, at: _Place) -> None:
        if self.range is not None and not self.range.contains(value):
            expected = self.range.describe(self.kind) + (" or null" if at.nullable else "")
            raise ConfigError(f"`{at.key}` must be {expected}, but is {value!r} instead (from {at.source}).")


class _Literal(_Kind):
    def __init__(self, values: tuple[Any, ...]) -> None:
        self.values = values

    def matches(self, value: Any) -> bool:
        return value in self.values

    def describe(self) -> str:
        return "one of " + ", ".join(repr(v) for v in self.values)


class _Union(_Kind):
    """``X | Y``: the first arm the value fits takes it; ``None`` is one arm of an optional."""

    def __init__(self, arms: list[_Kind]) -> None:
        self.arms = arms
        self.nullable = any(_is_none(arm) for arm in arms)

    def matches(self, value: Any) -> bool:
        return any(arm.matches(value) for arm in self.arms)

    def describe(self) -> str:
        return " or ".join(arm.describe() for arm in self.arms)

    def coerce(self, value: Any) -> Any:
        return next((arm.coerce(value) for arm in self.arms if arm.matches(arm.coerce(value))), value)

    def merge(self, base: Any, layer: Any, at: _Place) -> Any:
        layer = self.coerce(layer)
        arm = next((arm for arm in self.arms if arm.matches(layer)), None)
        if arm is None:
            raise at.type_error(self, layer)
        return arm.merge(base if arm.matches(base) else None, layer, dataclasses.replace(at, nullable=self.nullable))

    def build(self, data: Any, key: str) -> Any:
        arm = next((arm for arm in self.arms if arm.matches(data)), None)
        return data if arm is None else arm.build(data, key)

    def children(self) -> Iterator[tuple[str, _Kind]]:
        for arm in self.arms:
            yield from arm.children()


def _is_none(kind: _Kind) -> bool:
    return isinstance(kind, _Scalar) and kind.kind is type(None)


class _List(_Kind):
    def __init__(self, item: _Kind) -> None:
        self.item = item

    def matches(self, value: Any) -> bool:
        return isinstance(value, list) and all(self.item.matches(v) for v in value)

    def describe(self) -> str:
        return f"a list of {self.item.describe()}"

    def coerce(self, value: Any) -> Any:
        return [self.item.coerce(v) for v in value] if isinstance(value, list) else value

    def check(self, value: Any, at: _Place) -> None:
        for index, element in enumerate(value):
            self.item.check(element, dataclasses.replace(at, key=f"{at.key}[{index}]", nullable=False))

    def build(self, data: Any, key: str) -> Any:
        return [self.item.build(value, f"{key}{index}.") for index, value in enumerate(data)]


class _Map(_Kind):
    """``dict[str, X]``: keys chosen by the user, each value an ``X``; a layer replaces the whole mapping."""

    def __init__(self, item: _Kind) -> None:
        self.item = item

    def matches(self, value: Any) -> bool:
        return isinstance(value, Mapping) and all(isinstance(k, str) and self.item.matches(v) for k, v in value.items())

    def describe(self) -> str:
        return f"a mapping of {self.item.describe()}"

    def check(self, value: Any, at: _Place) -> None:
        for name, element in value.items():
            self.item.check(element, at.child(name))

    def build(self, data: Any, key: str) -> Any:
        return {name: self.item.build(value, f"{key}{name}.") for name, value in data.items()}


class _Section(_Kind):
    """A dataclass: a layer's keys are merged one by one onto the section's, each checked by its field's kind."""

    def __init__(self, struct: type) -> None:
        self.struct = struct

    @functools.cached_property
    def fields(self) -> dict[str, _Kind]:
        return {name: _kind_of(kind) for name, kind in typing.get_type_hints(self.struct, include_extras=True).items()}

    def matches(self, value: Any) -> bool:
        return isinstance(value, Mapping) and all(
            key in self.fields and self.fields[key].matches(item) for key, item in value.items()
        )

    def describe(self) -> str:
        return f"a mapping ({self.struct.__name__})"

    def merge(self, base: Any, layer: Any, at: _Place) -> Any:
        if not isinstance(layer, Mapping):
            raise at.type_error(self, layer)
        merged = dict(base) if isinstance(base, Mapping) else {}
        for key, value in layer.items():
            if key not in self.fields:
                hint = suggest_key(key, at.key, list(self.fields), valid_keys_of(at.root))
                raise ConfigError(f"Unknown config key '{at.child(key).key}' (from {at.source}).{hint}")
            merged[key] = self.fields[key].merge(merged.get(key), value, at.child(key))
        return merged

    def check(self, value: Any, at: _Place) -> None:
        for key, item in value.items():
            self.fields[key].check(item, at.child(key))

    def build(self, data: Any, key: str) -> Any:
        kwargs = {name: self.fields[name].build(value, f"{key}{name}.") for name, value in data.items()}
        try:
            return self.struct(**kwargs)
        except (ValueError, TypeError) as ex:
            where = f" in '{key.rstrip('.')}'" if key else ""
            raise ConfigError(f"Invalid config{where}: {ex}") from None

    def children(self) -> Iterator[tuple[str, _Kind]]:
        yield from self.fields.items()


class _Choice(_Kind):
    """A component chosen by ``name`` from a registry, with the options of its own config dataclass:
    ``optimizer: {name: sgd, momentum: 0.9}``, or just ``optimizer: sgd``.

    When a layer names another component, the section starts again from that one's defaults and
    keeps only what the earlier layers set that the new one also has (``lr`` from ``adamw`` to
    ``sgd``; not ``betas``), so a key never reaches a component that does not take it.
    """

    def __init__(self, registry: Registry[Any]) -> None:
        self.registry = registry

    def section(self, name: str, at: _Place | None = None) -> _Section:
        try:
            section = _kind_of(self.registry.get(name).config_class)
        except RegistryError as ex:
            if at is None:
                raise ConfigError(str(ex)) from None
            hint = closest(name, ex.known)
            raise ConfigError(
                f"`{at.child('name').key}` must be one of {', '.join(ex.known)}, but is {name!r} instead "
                f"(from {at.source}).{hint}"
            ) from None
        assert isinstance(section, _Section)
        return section

    def matches(self, value: Any) -> bool:
        if isinstance(value, str):
            return value in self.registry
        name = value.get("name") if isinstance(value, Mapping) else None
        return isinstance(name, str) and name in self.registry and self.section(name).matches(value)

    def describe(self) -> str:
        return f"a {self.registry.kind} (a name, or a mapping with its `name` and options)"

    def merge(self, base: Any, layer: Any, at: _Place) -> Any:
        if isinstance(layer, str):
            layer = {"name": layer}
        if not isinstance(layer, Mapping):
            raise at.type_error(self, layer)
        base = dict(base) if isinstance(base, Mapping) else {}
        name = layer.get("name", base.get("name"))
        if not isinstance(name, str):
            raise ConfigError(
                f"`{at.child('name').key}` must name a {self.registry.kind} ({', '.join(self.registry.names())}), "
                f"but is {name!r} instead (from {at.source})."
            )
        section = self.section(name, at)
        if name != base.get("name"):
            defaults = to_dict(self.registry.get(name).default_config())
            base = {key: base.get(key, value) if key != "name" else name for key, value in defaults.items()}
        return section.merge(base, layer, at)

    def build(self, data: Any, key: str) -> Any:
        return self.section(data["name"]).build(data, key)

    def children(self) -> Iterator[tuple[str, _Kind]]:
        """Every option of every component registered so far (for help and suggestions)."""
        seen: dict[str, _Kind] = {}
        for name in self.registry.names():
            try:
                seen.update(self.section(name).fields)
            except ConfigError:
                continue  # An installed component that fails to load says so when it is chosen.
        yield from seen.items()


def _annotated(kind: Any) -> _Kind:
    plain, *extras = get_args(kind)
    registry = next((extra for extra in extras if isinstance(extra, Registry)), None)
    if registry is not None:
        return _Choice(registry)
    valid = next((extra for extra in extras if isinstance(extra, Range)), None)
    if get_origin(plain) is list:  # A range on a list holds for every element.
        return _List(_ranged(get_args(plain)[0], valid))
    return _ranged(plain, valid)


def _ranged(kind: Any, valid: Range | None) -> _Kind:
    inner = _kind_of(kind)
    if isinstance(inner, _Number) and valid is not None:
        return _Number(inner.kind, valid)
    return inner


_KINDS: dict[Any, Callable[[Any], _Kind]] = {
    Annotated: _annotated,
    Union: lambda kind: _Union([_kind_of(arm) for arm in get_args(kind)]),
    types.UnionType: lambda kind: _Union([_kind_of(arm) for arm in get_args(kind)]),
    Literal: lambda kind: _Literal(get_args(kind)),
    list: lambda kind: _List(_kind_of(get_args(kind)[0])),
    dict: lambda kind: _Map(_kind_of(get_args(kind)[1])),
    Mapping: lambda kind: _Map(_kind_of(get_args(kind)[1])),
    int: lambda kind: _Number(int, None),
    float: lambda kind: _Number(float, None),
}
"""The kind of each form of annotation, by its origin (``list`` for ``list[int]``) or its class."""


_KIND_OF: dict[Any, _Kind] = {}


def _kind_of(annotation: Any) -> _Kind:
    """The kind of an annotation, made once: a section's fields and a registry's components are looked up once."""
    kind = _KIND_OF.get(annotation)
    if kind is None:
        make = _KINDS.get(get_origin(annotation) or annotation)
        if make is not None:
            kind = make(annotation)
        elif dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
            kind = _Section(annotation)
        else:
            kind = _Scalar(annotation)
        _KIND_OF[annotation] = kind
    return kind


# The keys of a config class, for help, suggestions and checks ------------------------------------------------


def valid_keys(config_class: type) -> list[str]:
    """Every dotted key of a config class, for help and for suggestions."""
    return valid_keys_of(_kind_of(config_class))


def valid_keys_of(kind: _Kind, prefix: str = "") -> list[str]:
    keys = []
    for name, inner in kind.children():
        keys.append(prefix + name)
        keys.extend(valid_keys_of(inner, f"{prefix}{name}."))
    return keys


@dataclass(frozen=True)
class NumericField:
    """A numeric field of a config class, found by ``numeric_fields``."""

    key: str
    """The dotted key (``model.hidden_dims``)."""
    kind: type
    """``int`` or ``float``."""
    range: Range | None
    """Its declared range; ``None``: none declared."""
    element: bool
    """Whether the numbers are the elements of a list."""
    optional: bool
    """Whether ``null`` is valid too."""
    choices: tuple[tuple[str, str], ...] = ()
    """The components it belongs to, as ``(key, name)`` overrides (``("optimizer.name", "sgd")``)."""


def numeric_fields(config_class: type) -> list[NumericField]:
    """Every int and float field of a config class, nested sections, lists and every registered
    component of a choice included, with its declared range: for a test that every field declares
    one and rejects what lies outside it."""
    return list(_numeric_fields(_kind_of(config_class), "", ()))


def _numeric_fields(kind: _Kind, prefix: str, choices: tuple[tuple[str, str], ...]) -> Iterator[NumericField]:
    if isinstance(kind, _Choice):
        for name in kind.registry.names():
            chosen = (*choices, (f"{prefix}name", name))
            yield from _numeric_fields(kind.section(name), prefix, chosen)
        return
    for name, inner in kind.children():
        key, optional, element = prefix + name, False, False
        if isinstance(inner, _Union) and inner.nullable and len(inner.arms) == 2:
            inner, optional = next(arm for arm in inner.arms if not _is_none(arm)), True
        if isinstance(inner, _List):
            inner, element = inner.item, True
        if isinstance(inner, _Number):
            yield NumericField(key, inner.kind, inner.declared, element, optional, choices)
        elif isinstance(inner, (_Section, _Choice)) and not element:
            yield from _numeric_fields(inner, key + ".", choices)
