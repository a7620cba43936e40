"""Typed configs from layered plain dicts.

A recipe's config is a dataclass. Layers of plain dicts (a preset, config files, command
line overrides) are merged onto its defaults, key by key, each checked against the
dataclass schema as it arrives so that an error can say which key, which type and which
layer. The result is rebuilt into the dataclass, and dumps back to YAML that loads again.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import yaml

from recipes.errors import UserError, closest

ConfigT = TypeVar("ConfigT")


class ConfigError(UserError):
    """A config key or value does not fit the recipe's config schema."""


class _YamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader, but ``1e-3`` is a float, as in YAML 1.2 and Python, not a string."""


_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def load_yaml(stream: Any) -> Any:
    """Parse YAML safely (no objects), reading exponent notation as floats."""
    return yaml.load(stream, Loader=_YamlLoader)


def to_dict(config: Any) -> Any:
    """The config as plain dicts, lists and scalars, in field order."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return {f.name: to_dict(getattr(config, f.name)) for f in dataclasses.fields(config)}
    if isinstance(config, Mapping):
        return {key: to_dict(value) for key, value in config.items()}
    if isinstance(config, (list, tuple)):
        return [to_dict(value) for value in config]
    return config


def dump_yaml(data: Any) -> str:
    return yaml.safe_dump(to_dict(data), sort_keys=False, default_flow_style=False)


def resolve_config(config_class: type[ConfigT], layers: list[tuple[str, Mapping[str, Any]]]) -> ConfigT:
    """Merge ``layers`` (``(source, dict)``, lowest precedence first) onto the class's defaults."""
    merged = to_dict(config_class())
    for source, layer in layers:
        merged = _merge(config_class, merged, layer, path="", source=source)
    config: ConfigT = _build(config_class, merged, path="")
    return config


def parse_override(text: str) -> tuple[str, Any]:
    """Split ``a.b=v`` into the key and its value, parsed as YAML (so ``3`` is an int, ``null`` None)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"An override must look like `section.key=value`, but is '{text}' instead.")
    try:
        value = load_yaml(raw) if raw.strip() else None
    except yaml.YAMLError as ex:
        raise ConfigError(
            f"The value of override '{key}' is not valid YAML: {raw!r} ({getattr(ex, 'problem', ex)})."
        ) from None
    return key.strip(), value


def overrides_to_dict(overrides: list[str]) -> dict[str, Any]:
    """``['a.b=1', 'a.c=x']`` as the nested dict ``{'a': {'b': 1, 'c': 'x'}}``."""
    result: dict[str, Any] = {}
    for text in overrides:
        key, value = parse_override(text)
        node = result
        *parents, leaf = key.split(".")
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"Override '{key}' conflicts with an earlier override of '{part}'.")
            node = child
        node[leaf] = value
    return result


def _merge(kind: Any, base: Any, layer: Any, path: str, source: str) -> Any:
    """``layer`` merged onto ``base``, both plain data of type ``kind``; checks keys and types."""
    struct = _dataclass_of(kind)
    if struct is not None and isinstance(layer, Mapping) and isinstance(base, Mapping):
        fields = {f.name: f for f in dataclasses.fields(struct)}
        merged = dict(base)
        for key, value in layer.items():
            key_path = f"{path}{key}"
            if key not in fields:
                siblings = [f"{path}{name}" for name in fields]
                hint = closest(key_path, siblings) or closest(key_path, _all_keys(struct, path))
                raise ConfigError(f"Unknown config key '{key_path}' (from {source}).{hint}")
            field_type = _field_types(struct)[key]
            merged[key] = _merge(field_type, base.get(key), value, key_path + ".", source)
        return merged
    _check_value(kind, layer, path.rstrip("."), source)
    return layer


def _build(kind: Any, data: Any, path: str) -> Any:
    """Plain ``data`` (already type-checked) rebuilt into ``kind``'s dataclasses."""
    struct = _dataclass_of(kind)
    if struct is not None and isinstance(data, Mapping):
        types_ = _field_types(struct)
        kwargs = {key: _build(types_[key], value, f"{path}{key}.") for key, value in data.items()}
        try:
            return struct(**kwargs)
        except (ValueError, TypeError) as ex:
            where = f" in '{path.rstrip('.')}'" if path else ""
            raise ConfigError(f"Invalid config{where}: {ex}") from None
    origin = get_origin(kind)
    if origin is list and isinstance(data, list):
        (item,) = get_args(kind)
        return [_build(item, value, f"{path}{i}.") for i, value in enumerate(data)]
    if origin in (dict, Mapping) and isinstance(data, Mapping):
        _, item = get_args(kind)
        return {key: _build(item, value, f"{path}{key}.") for key, value in data.items()}
    if kind is float and isinstance(data, int) and not isinstance(data, bool):
        return float(data)
    if _is_optional(kind) and data is not None:
        return _build(_strip_optional(kind), data, path)
    return data


def _check_value(kind: Any, value: Any, key: str, source: str) -> None:
    if not _matches(kind, value):
        raise ConfigError(
            f"Config key '{key}' must be {_type_name(kind)}, but is {value!r} ({type(value).__name__}) "
            f"instead (from {source})."
        )


def _matches(kind: Any, value: Any) -> bool:
    if kind is Any:
        return True
    if _is_optional(kind) or _is_union(kind):
        return any(_matches(arg, value) for arg in get_args(kind))
    if kind is type(None):
        return value is None
    origin = get_origin(kind)
    if origin is Literal:
        return value in get_args(kind)
    if origin is list:
        (item,) = get_args(kind)
        return isinstance(value, list) and all(_matches(item, v) for v in value)
    if origin in (dict, Mapping):
        _, item = get_args(kind)
        return isinstance(value, Mapping) and all(isinstance(k, str) and _matches(item, v) for k, v in value.items())
    struct = _dataclass_of(kind)
    if struct is not None:
        if not isinstance(value, Mapping):
            return False
        fields = _field_types(struct)
        return all(k in fields and _matches(fields[k], v) for k, v in value.items())
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is str:
        return isinstance(value, str)
    return isinstance(value, kind)


def _type_name(kind: Any) -> str:
    if _is_optional(kind) or _is_union(kind):
        return " or ".join(_type_name(arg) for arg in get_args(kind))
    if kind is type(None):
        return "null"
    origin = get_origin(kind)
    if origin is Literal:
        return "one of " + ", ".join(repr(v) for v in get_args(kind))
    if origin is list:
        return f"a list of {_type_name(get_args(kind)[0])}"
    if origin in (dict, Mapping):
        return f"a mapping of {_type_name(get_args(kind)[1])}"
    if _dataclass_of(kind) is not None:
        return f"a mapping ({kind.__name__})"
    return getattr(kind, "__name__", str(kind))


def _all_keys(struct: type, prefix: str) -> list[str]:
    keys = []
    for name, kind in _field_types(struct).items():
        keys.append(prefix + name)
        inner = _dataclass_of(kind)
        if inner is not None:
            keys.extend(_all_keys(inner, f"{prefix}{name}."))
    return keys


def valid_keys(config_class: type) -> list[str]:
    """Every dotted key of a config class, for help and for suggestions."""
    return _all_keys(config_class, "")


def _field_types(struct: type) -> dict[str, Any]:
    return typing.get_type_hints(struct)


def _dataclass_of(kind: Any) -> type | None:
    kind = _strip_optional(kind)
    return kind if isinstance(kind, type) and dataclasses.is_dataclass(kind) else None


def _is_union(kind: Any) -> bool:
    return get_origin(kind) in (Union, types.UnionType)


def _is_optional(kind: Any) -> bool:
    return _is_union(kind) and type(None) in get_args(kind)


def _strip_optional(kind: Any) -> Any:
    if _is_optional(kind):
        args = [arg for arg in get_args(kind) if arg is not type(None)]
        if len(args) == 1:
            return args[0]
    return kind
