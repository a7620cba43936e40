"""Typed configs from layered plain dicts.

A recipe's config is a dataclass. Layers of plain dicts (a preset, config files, command
line overrides) are merged onto its defaults, key by key, each checked against the
dataclass schema as it arrives so that an error can say which key, which type and which
layer. The result is rebuilt into the dataclass, and dumps back to YAML that loads again.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import yaml

from recipes.errors import UserError, closest

ConfigT = TypeVar("ConfigT")


class ConfigError(UserError):
    """A config key or value does not fit the recipe's config schema."""


@dataclass(frozen=True)
class Range:
    """The values a numeric config field may take, declared with its type so that the check and
    its message come from one place and no section repeats them in a ``__post_init__``:

        lr: Annotated[float, Range(gt=0)] = 1e-3
        max_num_steps: Annotated[int, Range(ge=1)] | None = 1000
        hidden_dims: list[Annotated[int, Range(ge=1)]] = ...   # every element

    Values are checked as each config layer is merged, so an error names the dotted key and the
    layer it came from. A float is finite unless declared ``finite=False`` (NaN never passes, as
    it compares with nothing); a float field without any ``Range`` is still checked as finite.
    """

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    finite: bool = True

    def __post_init__(self) -> None:
        if (self.ge is not None and self.gt is not None) or (self.le is not None and self.lt is not None):
            raise TypeError("A Range takes at most one lower bound (ge or gt) and one upper bound (le or lt).")

    def contains(self, value: float) -> bool:
        if math.isnan(value) or (self.finite and math.isinf(value)):
            return False
        return (
            (self.ge is None or value >= self.ge)
            and (self.gt is None or value > self.gt)
            and (self.le is None or value <= self.le)
            and (self.lt is None or value < self.lt)
        )

    def describe(self, kind: type) -> str:
        """``an integer >= 1``, ``a finite number in [0, 1)``: what a value of ``kind`` must be."""
        noun = "an integer" if kind is int else "a finite number" if self.finite else "a number"
        low = (">=", self.ge) if self.ge is not None else (">", self.gt) if self.gt is not None else None
        high = ("<=", self.le) if self.le is not None else ("<", self.lt) if self.lt is not None else None
        if low is not None and high is not None:
            left, right = "[" if low[0] == ">=" else "(", "]" if high[0] == "<=" else ")"
            return f"{noun} in {left}{_number(low[1])}, {_number(high[1])}{right}"
        bound = low or high
        return noun if bound is None else f"{noun} {bound[0]} {_number(bound[1])}"


# Ranges most fields need, for sections to declare in a word.
PositiveInt = Annotated[int, Range(ge=1)]
NonNegativeInt = Annotated[int, Range(ge=0)]
PositiveFloat = Annotated[float, Range(gt=0)]
NonNegativeFloat = Annotated[float, Range(ge=0)]


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
    defaults = to_dict(config_class())
    merged = _merge(config_class, {}, defaults, path="", source=f"the defaults of {config_class.__name__}")
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


def _merge(kind: Any, base: Any, layer: Any, path: str, source: str, root: type | None = None) -> Any:
    """``layer`` merged onto ``base``, both plain data of type ``kind`` (a part of the config class
    ``root``); checks keys, types and ranges."""
    struct = _dataclass_of(kind)
    if struct is not None and isinstance(layer, Mapping) and isinstance(base, Mapping):
        fields = _field_types(struct)
        merged = dict(base)
        for key, value in layer.items():
            key_path = f"{path}{key}"
            if key not in fields:
                hint = _suggest_key(root or struct, struct, key, path)
                raise ConfigError(f"Unknown config key '{key_path}' (from {source}).{hint}")
            merged[key] = _merge(fields[key], base.get(key), value, key_path + ".", source, root or struct)
        return merged
    layer = _coerce_non_finite(kind, layer)
    _check_value(kind, layer, path.rstrip("."), source)
    _check_ranges(kind, layer, path.rstrip("."), source)
    return layer


def _build(kind: Any, data: Any, path: str) -> Any:
    """Plain ``data`` (already type-checked) rebuilt into ``kind``'s dataclasses."""
    kind = _plain(kind)
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


_NON_FINITE = {"nan": math.nan, "inf": math.inf, "+inf": math.inf, "-inf": -math.inf}


def _coerce_non_finite(kind: Any, value: Any) -> Any:
    """``inf`` and ``nan`` typed where a float goes, as Python's ``float()`` reads them, so that they
    meet the range check (and its clear message) rather than a type error; YAML spells them ``.inf``."""
    if isinstance(value, str) and value.strip().lower() in _NON_FINITE and _accepts_float(kind):
        return _NON_FINITE[value.strip().lower()]
    if get_origin(_strip_optional(kind)) is list and isinstance(value, list):
        (item,) = get_args(_strip_optional(kind))
        return [_coerce_non_finite(item, v) for v in value]
    return value


def _accepts_float(kind: Any) -> bool:
    kind = _plain(kind)
    if _is_union(kind):
        return any(_accepts_float(arg) for arg in get_args(kind))
    return kind is float


def _check_ranges(
    kind: Any, value: Any, key: str, source: str, declared: Range | None = None, nullable: bool = False
) -> None:
    """Every number in ``value`` (already type-checked) within the ``Range`` its type declares."""
    if get_origin(kind) is Annotated:
        plain, *extras = get_args(kind)
        found = [extra for extra in extras if isinstance(extra, Range)]
        return _check_ranges(plain, value, key, source, found[0] if found else declared, nullable)
    if _is_union(kind):
        arm = next((arg for arg in get_args(kind) if _matches(arg, value)), None)
        if arm is not None:
            _check_ranges(arm, value, key, source, declared, nullable or _is_optional(kind))
        return
    origin = get_origin(kind)
    if origin is list and isinstance(value, list):
        (item,) = get_args(kind)
        for i, element in enumerate(value):
            _check_ranges(item, element, f"{key}[{i}]", source, declared)
        return
    if origin in (dict, Mapping) and isinstance(value, Mapping):
        _, item = get_args(kind)
        for name, element in value.items():
            _check_ranges(item, element, f"{key}.{name}", source)
        return
    struct = _dataclass_of(kind)
    if struct is not None and isinstance(value, Mapping):
        fields = _field_types(struct)
        for name, element in value.items():
            _check_ranges(fields[name], element, f"{key}.{name}" if key else name, source)
        return
    if kind in (int, float) and isinstance(value, (int, float)) and not isinstance(value, bool):
        valid = declared or (Range() if kind is float else None)
        if valid is not None and not valid.contains(value):
            expected = valid.describe(kind) + (" or null" if nullable else "")
            raise ConfigError(f"`{key}` must be {expected}, but is {value!r} instead (from {source}).")


def _number(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() and abs(bound) < 1e16 else repr(bound)


def _check_value(kind: Any, value: Any, key: str, source: str) -> None:
    if not _matches(kind, value):
        raise ConfigError(
            f"Config key '{key}' must be {_type_name(kind)}, but is {value!r} ({type(value).__name__}) "
            f"instead (from {source})."
        )


def _matches(kind: Any, value: Any) -> bool:
    kind = _plain(kind)
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
    kind = _plain(kind)
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


# Names users bring from other trainers: a synonym is no misspelling, so difflib misses it
# (``learning_rate`` is far from ``lr`` by edit distance, and near ``name``). Looked up without
# case, ``_`` or ``-``.
_SYNONYMS = {
    "lr": "learning_rate lrate",
    "weight_decay": "wd l2 decay",
    "max_num_steps": "num_steps max_steps steps total_steps train_steps num_train_steps",
    "max_num_data_epochs": "epochs num_epochs max_epochs num_train_epochs",
    "batch_size": "batch bs train_batch_size global_batch_size",
    "grad_accumulation": "grad_accum gradient_accumulation gradient_accumulation_steps accumulate_grad_batches",
    "num_warmup_steps": "warmup warmup_steps",
    "max_grad_norm": "clip_grad_norm grad_clip gradient_clipping clip_norm max_norm",
    "tp_size": "tp tensor_parallel_size",
    "mixed_precision": "precision amp",
    "lr_scheduler": "scheduler lr_schedule",
    "dim": "embedding_dim emb_dim",
    "seed": "random_seed",
}
KEY_ALIASES = {alias.replace("_", ""): key for key, aliases in _SYNONYMS.items() for alias in aliases.split()}


def _normalized(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "")


def _suggest_key(root: type, struct: type, key: str, path: str) -> str:
    """' Did you mean ...?' for an unknown ``key`` in the section ``path`` of ``struct``: the same name
    spelled another way, a known synonym, a near spelling among its siblings, then the same or a near
    name anywhere in the config (``lr`` at the top -> ``optimizer.lr``)."""
    siblings = list(_field_types(struct))
    wanted = _normalized(key)
    target = next((name for name in siblings if _normalized(name) == wanted), None)
    target = target or KEY_ALIASES.get(wanted)
    if target in siblings:
        return f" Did you mean '{path}{target}'?"
    everywhere = _all_keys(root, "")
    names = {wanted, _normalized(target or wanted)}
    named = [k for k in everywhere if _normalized(k.rsplit(".", 1)[-1]) in names]
    if named:
        return " Did you mean " + " or ".join(f"'{k}'" for k in named[:2]) + "?"
    return closest(f"{path}{key}", [f"{path}{name}" for name in siblings]) or closest(f"{path}{key}", everywhere)


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


def numeric_fields(config_class: type) -> list[NumericField]:
    """Every int and float field of a config class, nested sections and lists included, with its
    declared range: for a test that every field declares one and rejects what lies outside it."""
    found = []
    for key, kind in _leaf_types(config_class, ""):
        optional, extras = _is_optional(kind), _extras(kind)
        kind = _strip_optional(kind)
        element = get_origin(kind) is list
        if element:
            (kind,) = get_args(kind)
            extras = _extras(kind) + extras
        if _plain(kind) in (int, float):
            ranges = [extra for extra in extras if isinstance(extra, Range)]
            found.append(NumericField(key, _plain(kind), ranges[0] if ranges else None, element, optional))
    return found


def _leaf_types(struct: type, prefix: str) -> list[tuple[str, Any]]:
    leaves = []
    for name, kind in _field_types(struct).items():
        inner = _dataclass_of(kind)
        if inner is not None:
            leaves.extend(_leaf_types(inner, f"{prefix}{name}."))
        else:
            leaves.append((prefix + name, kind))
    return leaves


def _extras(kind: Any) -> list[Any]:
    """The ``Annotated`` metadata of ``kind``, outside or inside an optional."""
    extras: list[Any] = []
    for part in (kind, *(get_args(kind) if _is_union(kind) else ())):
        while get_origin(part) is Annotated:
            extras.extend(get_args(part)[1:])
            part = get_args(part)[0]
    return extras


def valid_keys(config_class: type) -> list[str]:
    """Every dotted key of a config class, for help and for suggestions."""
    return _all_keys(config_class, "")


@functools.cache
def _field_types(struct: type) -> dict[str, Any]:
    """The fields' types with their ``Annotated`` ranges, which every other helper looks through;
    cached, as every key of every layer asks again (callers must not change the dict)."""
    return typing.get_type_hints(struct, include_extras=True)


def _plain(kind: Any) -> Any:
    while get_origin(kind) is Annotated:
        kind = get_args(kind)[0]
    return kind


def _dataclass_of(kind: Any) -> type | None:
    kind = _strip_optional(_plain(kind))
    return kind if isinstance(kind, type) and dataclasses.is_dataclass(kind) else None


def _is_union(kind: Any) -> bool:
    return get_origin(_plain(kind)) in (Union, types.UnionType)


def _is_optional(kind: Any) -> bool:
    return _is_union(kind) and type(None) in get_args(_plain(kind))


def _strip_optional(kind: Any) -> Any:
    kind = _plain(kind)
    if _is_optional(kind):
        args = [arg for arg in get_args(kind) if arg is not type(None)]
        if len(args) == 1:
            return args[0]
    return kind
