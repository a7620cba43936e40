"""Configs as text: YAML in and out, and ``section.key=value`` overrides from the command line."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Any, TextIO

import yaml

from recipes.errors import ConfigError


class _YamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader, but ``1e-3`` is a float, as in YAML 1.2 and Python, not a string."""


_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def load_yaml(stream: str | TextIO) -> Any:
    """Parse YAML safely (no objects), reading exponent notation as floats."""
    return yaml.load(stream, Loader=_YamlLoader)


def read_yaml_file(path: str | os.PathLike[str]) -> Any:
    """The YAML in the file at ``path``, a config or preset file the user named (``yaml.YAMLError`` if it is not YAML).

    A file this user may not read, or that is not UTF-8 text (an image given as ``--config-file``), is the user's
    error, naming the file: not a ``PermissionError`` or a ``UnicodeDecodeError`` (which names none) and exit 1.
    """
    try:
        with open(path, encoding="utf-8") as file:
            return load_yaml(file)
    except PermissionError as ex:
        raise ConfigError(f"The file {path} must be readable by this user, but is not ({ex.strerror}).") from None
    except UnicodeDecodeError as ex:
        raise ConfigError(
            f"The file {path} must be YAML, which is UTF-8 text, but is not text ({ex.reason})."
        ) from None


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
            if isinstance(child, str):  # `optimizer=sgd optimizer.momentum=0.9`: the name, then an option.
                child = node[part] = {"name": child}
            if not isinstance(child, dict):
                raise ConfigError(f"Override '{key}' conflicts with an earlier override of '{part}'.")
            node = child
        if isinstance(node.get(leaf), dict) and isinstance(value, str):
            value = {**node[leaf], "name": value}  # `optimizer.momentum=0.9 optimizer=sgd`: the options stay.
        node[leaf] = value
    return result
