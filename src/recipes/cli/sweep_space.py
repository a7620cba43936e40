"""A sweep's search space: config keys and their ranges, from a preset's ``sweep:`` section or a ``--space`` file.

A space maps config keys (``optimizer.lr``, ``model.name``) to one range each::

    optimizer.lr: {log_uniform: [1.0e-4, 1.0e-1]}
    model.dropout: {uniform: [0.0, 0.5]}
    model.embeddings.dim: {int: [8, 64], step: 8}
    model.name: {choice: [fm, deepfm]}

It is checked against the recipe's config before any trial runs: every bound and every choice is resolved as an
override of the preset, so a key the config lacks, a value its field refuses and a component that does not exist
are one line each, as they would be on ``train``'s command line, rather than a failed trial per sample.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
import yaml

from recipes.config.text import read_yaml_file
from recipes.errors import ConfigError, UserError

KINDS = ("log_uniform", "uniform", "int", "choice")
_INT_OPTIONS = ("step",)
Choice = str | int | float | bool | None


@dataclass(frozen=True)
class Range:
    """One key's range: its kind (one of ``KINDS``), its bounds or choices, and an int range's step."""

    key: str
    kind: str
    values: tuple[Choice, ...]
    """``(low, high)`` for the numeric kinds, the choices for ``choice``."""
    step: int = 1

    def distribution(self) -> optuna.distributions.BaseDistribution:
        """The range as Optuna samples it."""
        if self.kind == "choice":
            return optuna.distributions.CategoricalDistribution(self.values)
        low, high = self.values
        if self.kind == "int":
            return optuna.distributions.IntDistribution(int(low), int(high), step=self.step)  # type: ignore[arg-type]
        return optuna.distributions.FloatDistribution(float(low), float(high), log=self.kind == "log_uniform")  # type: ignore[arg-type]

    def bounds(self) -> tuple[Choice, ...]:
        """The values that stand for the whole range when it is checked against the config: the bounds of a numeric
        range, typed as its samples are (a field that takes ints refuses a float range), and every choice."""
        if self.kind == "choice":
            return self.values
        convert: Callable[[Any], Choice] = int if self.kind == "int" else float
        return tuple(convert(value) for value in self.values)


@dataclass(frozen=True)
class Space:
    """The ranges of a sweep, in the order they were declared (the order a trial samples them in), and where from."""

    ranges: tuple[Range, ...]
    source: str

    def distributions(self) -> dict[str, optuna.distributions.BaseDistribution]:
        return {r.key: r.distribution() for r in self.ranges}


def read_space_file(path: str) -> Space:
    """The space of a ``--space`` file: the mapping of keys to ranges, alone or under a ``sweep:`` key."""
    try:
        data = read_yaml_file(path)
    except FileNotFoundError:
        raise UserError(f"The space file {path} must exist, but does not.") from None
    except yaml.YAMLError as ex:
        raise UserError(f"The space file {path} must be YAML, but is not: {ex}".replace("\n", " ")) from None
    if isinstance(data, dict) and set(data) == {"sweep"}:
        data = data["sweep"]
    return parse_space(data, f"the space file {path}")


def parse_space(data: Any, source: str) -> Space:
    """``data`` (a ``sweep:`` section) as a space; a range that is no range, or empty, is one line naming its key."""
    if not isinstance(data, Mapping) or not data:
        raise UserError(f"The sweep space ({source}) must map config keys to ranges, but is {_shown(data)} instead.")
    return Space(tuple(_parse_range(str(key), value, source) for key, value in data.items()), source)


def _parse_range(key: str, value: Any, source: str) -> Range:
    where = f"The range of `{key}` ({source})"
    kinds = [kind for kind in KINDS if isinstance(value, Mapping) and kind in value]
    if len(kinds) != 1:
        raise ConfigError(
            f"{where} must be a mapping with one of {', '.join(KINDS)} (such as `{{log_uniform: [1.0e-4, 0.1]}}`), "
            f"but is {_shown(value)} instead."
        )
    kind = kinds[0]
    options = {name: option for name, option in value.items() if name != kind}
    allowed = _INT_OPTIONS if kind == "int" else ()
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ConfigError(
            f"{where} must have {'only the option `step`' if allowed else 'no option'} beside `{kind}`, but has "
            f"`{unknown[0]}` instead."
        )
    values = value[kind]
    if kind == "choice":
        return Range(key, kind, _choices(values, where))
    low, high = _bounds(kind, values, where)
    step = options.get("step", 1)
    if kind == "int" and (isinstance(step, bool) or not isinstance(step, int) or step < 1):
        raise ConfigError(f"{where} must have an integer `step` >= 1, but has {_shown(step)} instead.")
    return Range(key, kind, (low, high), step)


def _choices(values: Any, where: str) -> tuple[Choice, ...]:
    if not isinstance(values, list) or not values:
        raise ConfigError(f"{where} must list its choices (`{{choice: [a, b]}}`), but is {_shown(values)} instead.")
    for choice in values:
        if choice is not None and not isinstance(choice, (str, int, float, bool)):
            raise ConfigError(
                f"{where} must choose among plain values (names, numbers, booleans), but has {_shown(choice)}."
            )
    if len(set(map(repr, values))) != len(values):
        raise ConfigError(f"{where} must list each choice once, but is {_shown(values)} instead.")
    return tuple(values)


def _bounds(kind: str, values: Any, where: str) -> tuple[float, float]:
    numbers = isinstance(values, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    if not numbers or len(values) != 2:
        raise ConfigError(f"{where} must be two numbers `[low, high]`, but is {_shown(values)} instead.")
    low, high = values
    if kind == "int" and not (isinstance(low, int) and isinstance(high, int)):
        raise ConfigError(f"{where} must be two integers, but is {_shown(values)} instead.")
    if not low < high:
        raise ConfigError(f"{where} must not be empty (low < high), but is [{low}, {high}] instead.")
    if kind == "log_uniform" and low <= 0:
        raise ConfigError(f"{where} must lie above 0 to be log-uniform, but starts at {low} instead.")
    return low, high


def check_space(space: Space, resolve: Callable[[Mapping[str, Any], str], object]) -> None:
    """Resolve every bound and choice of ``space`` as an override of the config (``resolve(layer, source)``), so that
    a key the config lacks, a value its field refuses or a component that does not exist stops the sweep before its
    first trial, in the resolution's own words."""
    for range_ in space.ranges:
        for value in range_.bounds():
            resolve(nested({range_.key: value}), f"the sweep space ({space.source}), {range_.key}={value!r}")


def refuse_overridden(space: Space, overrides: Sequence[str]) -> None:
    """A swept key that an override also sets would be both fixed and sampled: refused."""
    keys = {override.partition("=")[0].strip() for override in overrides}
    for range_ in space.ranges:
        if range_.key in keys:
            raise UserError(
                f"`{range_.key}` must be either swept ({space.source}) or overridden, but is both: drop the override."
            )


def nested(params: Mapping[str, Any]) -> dict[str, Any]:
    """``{'a.b': 1, 'a.c': 2}`` as the config layer ``{'a': {'b': 1, 'c': 2}}``."""
    layer: dict[str, Any] = {}
    for key, value in params.items():
        node = layer
        *parents, leaf = key.split(".")
        for part in parents:
            if isinstance(node.get(part), str):  # `optimizer: sgd` sampled, then `optimizer.lr`: the name, an option.
                node[part] = {"name": node[part]}
            node = node.setdefault(part, {})
        node[leaf] = value
    return layer


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
