"""Typed configs from layered plain dicts.

A recipe's config is a dataclass. Layers of plain dicts (a preset, config files, command line
overrides) are merged onto its defaults, key by key, each checked against the dataclass schema
as it arrives so that an error can say which key, which type and which layer. The result is
rebuilt into the dataclass, and dumps back to YAML that loads again.

Every form a field's type takes (a number with its range, an optional, a literal, a list, a
mapping, a nested section, a component chosen by name) is handled by one ``Kind``; the table
``_KINDS`` says which, and every step (check, merge, build, list the keys) asks the kind.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
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
from recipes.config.key_hints import suggest_key
from recipes.config.kinds import (
    Kind,
    ListKind,
    LiteralKind,
    MapKind,
    NumberKind,
    Place,
    ScalarKind,
    UnionKind,
    is_none,
)
from recipes.config.text import dump_yaml, load_yaml, overrides_to_dict, parse_override, to_dict
from recipes.errors import ConfigError, closest

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
    merged = root.merge({}, to_dict(config_class()), Place(root, "", f"the defaults of {config_class.__name__}"))
    for source, layer in layers:
        merged = root.merge(merged, layer, Place(root, "", source))
    config: ConfigT = root.build(merged, "")
    return config


class _Section(Kind):
    """A dataclass: a layer's keys are merged one by one onto the section's, each checked by its field's kind."""

    def __init__(self, struct: type) -> None:
        self.struct = struct

    @functools.cached_property
    def fields(self) -> dict[str, Kind]:
        return {name: _kind_of(kind) for name, kind in typing.get_type_hints(self.struct, include_extras=True).items()}

    def matches(self, value: Any) -> bool:
        return isinstance(value, Mapping) and all(
            key in self.fields and self.fields[key].matches(item) for key, item in value.items()
        )

    def describe(self) -> str:
        return f"a mapping ({self.struct.__name__})"

    def merge(self, base: Any, layer: Any, at: Place) -> Any:
        if not isinstance(layer, Mapping):
            raise at.type_error(self, layer)
        merged = dict(base) if isinstance(base, Mapping) else {}
        for key, value in layer.items():
            if key not in self.fields:
                hint = suggest_key(key, at.key, list(self.fields), valid_keys_of(at.root))
                raise ConfigError(f"Unknown config key '{at.child(key).key}' (from {at.source}).{hint}")
            merged[key] = self.fields[key].merge(merged.get(key), value, at.child(key))
        return merged

    def check(self, value: Any, at: Place) -> None:
        for key, item in value.items():
            self.fields[key].check(item, at.child(key))

    def build(self, data: Any, key: str) -> Any:
        kwargs = {name: self.fields[name].build(value, f"{key}{name}.") for name, value in data.items()}
        try:
            return self.struct(**kwargs)
        except (ValueError, TypeError) as ex:
            where = f" in '{key.rstrip('.')}'" if key else ""
            raise ConfigError(f"Invalid config{where}: {ex}") from None

    def children(self) -> Iterator[tuple[str, Kind]]:
        yield from self.fields.items()


class _Choice(Kind):
    """A component chosen by ``name`` from a registry, with the options of its own config dataclass:
    ``optimizer: {name: sgd, momentum: 0.9}``, or just ``optimizer: sgd``.

    When a layer names another component, the section starts again from that one's defaults and
    keeps only what the earlier layers set that the new one also has (``lr`` from ``adamw`` to
    ``sgd``; not ``betas``), so a key never reaches a component that does not take it.
    """

    def __init__(self, registry: Registry[Any]) -> None:
        self.registry = registry

    def section(self, name: str, at: Place | None = None) -> _Section:
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
        return f"{_article(self.registry.kind)} (a name, or a mapping with its `name` and options)"

    def merge(self, base: Any, layer: Any, at: Place) -> Any:
        if isinstance(layer, str):
            layer = {"name": layer}
        if not isinstance(layer, Mapping):
            raise at.type_error(self, layer)
        base = dict(base) if isinstance(base, Mapping) else {}
        name = layer.get("name", base.get("name"))
        if not isinstance(name, str):
            raise ConfigError(
                f"`{at.child('name').key}` must name {_article(self.registry.kind)} "
                f"({', '.join(self.registry.names())}), but is {name!r} instead (from {at.source})."
            )
        section = self.section(name, at)
        for key in layer:
            if key not in section.fields:
                raise self._unknown_option(key, name, at)
        if name != base.get("name"):
            defaults = to_dict(self.registry.get(name).default_config())
            base = {key: base.get(key, value) if key != "name" else name for key, value in defaults.items()}
        return section.merge(base, layer, at)

    def build(self, data: Any, key: str) -> Any:
        return self.section(data["name"]).build(data, key)

    def _unknown_option(self, key: str, name: str, at: Place) -> ConfigError:
        """An option ``name`` does not take: say which components take it, or what ``name`` takes."""
        section = self.section(name)
        takers = [other for other in self.registry.names() if key in self.section(other).fields]
        if takers:
            hint = f" It is an option of {', '.join(takers)}."
        else:
            hint = suggest_key(key, at.key, list(section.fields), valid_keys_of(at.root))
        return ConfigError(
            f"Unknown config key '{at.child(key).key}' for {self.registry.kind} '{name}' (from {at.source}).{hint}"
        )

    def children(self) -> Iterator[tuple[str, Kind]]:
        """Every option of every component registered so far (for help and suggestions)."""
        seen: dict[str, Kind] = {}
        for name in self.registry.names():
            try:
                seen.update(self.section(name).fields)
            except ConfigError:
                continue  # An installed component that fails to load says so when it is chosen.
        yield from seen.items()


class _ChoiceMap(Kind):
    """Components chosen by key, each with its own options: ``{tensorboard: true, wandb: {project: p}}``.

    Layers merge key by key, so a preset may turn one on and a user another off; ``true`` and
    ``false`` stand for ``{enabled: true}`` and ``{enabled: false}``. A key must name a component.
    """

    def __init__(self, registry: Registry[Any]) -> None:
        self.choice = _Choice(registry)
        self.registry = registry

    def matches(self, value: Any) -> bool:
        return isinstance(value, Mapping) and all(
            key in self.registry
            and (isinstance(item, bool) or (isinstance(item, Mapping) and self.choice.matches({**item, "name": key})))
            for key, item in value.items()
        )

    def describe(self) -> str:
        return f"a mapping of {self.registry.kind} names to their options"

    def merge(self, base: Any, layer: Any, at: Place) -> Any:
        if not isinstance(layer, Mapping):
            raise at.type_error(self, layer)
        merged = dict(base) if isinstance(base, Mapping) else {}
        for key, value in layer.items():
            if key not in self.registry:
                raise ConfigError(
                    f"`{at.child(key).key}` must name {_article(self.registry.kind)} "
                    f"({', '.join(self.registry.names())}), but '{key}' is none (from {at.source})."
                    + closest(key, self.registry.names())
                )
            options = {"enabled": value} if isinstance(value, bool) else value
            if not isinstance(options, Mapping) or options.get("name", key) != key:
                raise ConfigError(
                    f"Config key '{at.child(key).key}' must be true, false or a mapping of the {self.registry.kind}'s "
                    f"options, but is {value!r} ({type(value).__name__}) instead (from {at.source})."
                )
            merged[key] = self.choice.merge(merged.get(key), {**options, "name": key}, at.child(key))
        return merged

    def build(self, data: Any, key: str) -> Any:
        return {name: self.choice.build(options, f"{key}{name}.") for name, options in data.items()}

    def children(self) -> Iterator[tuple[str, Kind]]:
        for name in self.registry.names():
            yield name, _Options(self.choice.section(name))


class _Options(Kind):
    """A component's section under its name in a ``_ChoiceMap``: its options, the name being the key."""

    def __init__(self, section: _Section) -> None:
        self.section = section

    def matches(self, value: Any) -> bool:
        return self.section.matches(value)

    def describe(self) -> str:
        return self.section.describe()

    def children(self) -> Iterator[tuple[str, Kind]]:
        return ((key, kind) for key, kind in self.section.children() if key != "name")


def _article(noun: str) -> str:
    return f"{'an' if noun[0].lower() in 'aeiou' else 'a'} {noun}"


def _annotated(kind: Any) -> Kind:
    plain, *extras = get_args(kind)
    registry = next((extra for extra in extras if isinstance(extra, Registry)), None)
    if registry is not None:
        return _ChoiceMap(registry) if get_origin(plain) is dict else _Choice(registry)
    valid = next((extra for extra in extras if isinstance(extra, Range)), None)
    if get_origin(plain) is list:  # A range on a list holds for every element.
        return ListKind(_ranged(get_args(plain)[0], valid))
    return _ranged(plain, valid)


def _ranged(kind: Any, valid: Range | None) -> Kind:
    inner = _kind_of(kind)
    if isinstance(inner, NumberKind) and valid is not None:
        return NumberKind(inner.kind, valid)
    return inner


_KINDS: dict[Any, Callable[[Any], Kind]] = {
    Annotated: _annotated,
    Union: lambda kind: UnionKind([_kind_of(arm) for arm in get_args(kind)]),
    types.UnionType: lambda kind: UnionKind([_kind_of(arm) for arm in get_args(kind)]),
    Literal: lambda kind: LiteralKind(get_args(kind)),
    list: lambda kind: ListKind(_kind_of(get_args(kind)[0])),
    dict: lambda kind: MapKind(_kind_of(get_args(kind)[1])),
    Mapping: lambda kind: MapKind(_kind_of(get_args(kind)[1])),
    int: lambda kind: NumberKind(int, None),
    float: lambda kind: NumberKind(float, None),
}
"""The kind of each form of annotation, by its origin (``list`` for ``list[int]``) or its class."""


_KIND_OF: dict[Any, Kind] = {}


def _kind_of(annotation: Any) -> Kind:
    """The kind of an annotation, made once: a section's fields and a registry's components are looked up once."""
    kind = _KIND_OF.get(annotation)
    if kind is None:
        make = _KINDS.get(get_origin(annotation) or annotation)
        if make is not None:
            kind = make(annotation)
        elif dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
            kind = _Section(annotation)
        else:
            kind = ScalarKind(annotation)
        _KIND_OF[annotation] = kind
    return kind


# The keys of a config class, for help, suggestions and checks ------------------------------------------------


def valid_keys(config_class: type) -> list[str]:
    """Every dotted key of a config class, for help and for suggestions."""
    return valid_keys_of(_kind_of(config_class))


def valid_keys_of(kind: Kind, prefix: str = "") -> list[str]:
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


def _numeric_fields(kind: Kind, prefix: str, choices: tuple[tuple[str, str], ...]) -> Iterator[NumericField]:
    if isinstance(kind, _Choice):
        for name in kind.registry.names():
            chosen = (*choices, (f"{prefix}name", name))
            yield from _numeric_fields(kind.section(name), prefix, chosen)
        return
    for name, inner in kind.children():
        key, optional, element = prefix + name, False, False
        if isinstance(inner, UnionKind) and inner.nullable and len(inner.arms) == 2:
            inner, optional = next(arm for arm in inner.arms if not is_none(arm)), True
        if isinstance(inner, ListKind):
            inner, element = inner.item, True
        if isinstance(inner, NumberKind):
            yield NumericField(key, inner.kind, inner.declared, element, optional, choices)
        elif isinstance(inner, (_Section, _Choice, _ChoiceMap, _Options)) and not element:
            yield from _numeric_fields(inner, key + ".", choices)
