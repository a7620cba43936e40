"""The kinds of config values a section's fields hold, and where a value being merged sits.

``recipes.config.resolution`` maps each form of type annotation to one of these (its ``_KINDS`` table), and
adds the kinds that nest: sections, and components chosen by name.
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from components import Range
from recipes.errors import ConfigError


@dataclass(frozen=True)
class Place:
    """Where a value being merged sits: the dotted key, the layer it came from, and the root kind
    (for suggestions that look across the whole config)."""

    root: Kind
    key: str
    source: str
    nullable: bool = False

    def child(self, name: str) -> Place:
        return Place(self.root, f"{self.key}.{name}" if self.key else name, self.source)

    def type_error(self, kind: Kind, value: Any) -> ConfigError:
        return ConfigError(
            f"Config key '{self.key}' must be {kind.describe()}, but is {value!r} ({type(value).__name__}) "
            f"instead (from {self.source})."
        )


class Kind(ABC):
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

    def merge(self, base: Any, layer: Any, at: Place) -> Any:
        """``layer`` merged onto ``base``: for most kinds the layer replaces the base, once checked."""
        layer = self.coerce(layer)
        if not self.matches(layer):
            raise at.type_error(self, layer)
        self.check(layer, at)
        return layer

    def check(self, value: Any, at: Place) -> None:
        """Checks beyond the type (ranges), on a value that matches."""

    def build(self, data: Any, key: str) -> Any:
        """Checked plain data rebuilt into what the config holds (dataclasses, floats)."""
        return data

    def children(self) -> Iterator[tuple[str, Kind]]:
        """The nested keys under a value of this kind, with their kinds (none but for sections)."""
        return iter(())


class ScalarKind(Kind):
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


NON_FINITE = {"nan": math.nan, "inf": math.inf, "+inf": math.inf, "-inf": -math.inf}


class NumberKind(ScalarKind):
    """An int or float within its declared ``Range`` (a float without one: any finite float)."""

    def __init__(self, kind: type, valid: Range | None) -> None:
        super().__init__(kind)
        self.range = valid if valid is not None or kind is int else Range()
        self.declared = valid

    def coerce(self, value: Any) -> Any:
        """``inf`` and ``nan`` typed where a float goes, as Python's ``float()`` reads them, so that they
        meet the range check (and its clear message) rather than a type error; YAML spells them ``.inf``."""
        if self.kind is float and isinstance(value, str) and value.strip().lower() in NON_FINITE:
            return NON_FINITE[value.strip().lower()]
        return value

    def check(self, value: Any, at: Place) -> None:
        if self.range is not None and not self.range.contains(value):
            expected = self.range.describe(self.kind) + (" or null" if at.nullable else "")
            raise ConfigError(f"`{at.key}` must be {expected}, but is {value!r} instead (from {at.source}).")


class LiteralKind(Kind):
    def __init__(self, values: tuple[Any, ...]) -> None:
        self.values = values

    def matches(self, value: Any) -> bool:
        return value in self.values

    def describe(self) -> str:
        return "one of " + ", ".join(repr(v) for v in self.values)


class UnionKind(Kind):
    """``X | Y``: the first arm the value fits takes it; ``None`` is one arm of an optional."""

    def __init__(self, arms: list[Kind]) -> None:
        self.arms = arms
        self.nullable = any(is_none(arm) for arm in arms)

    def matches(self, value: Any) -> bool:
        return any(arm.matches(value) for arm in self.arms)

    def describe(self) -> str:
        return " or ".join(arm.describe() for arm in self.arms)

    def coerce(self, value: Any) -> Any:
        return next((arm.coerce(value) for arm in self.arms if arm.matches(arm.coerce(value))), value)

    def merge(self, base: Any, layer: Any, at: Place) -> Any:
        layer = self.coerce(layer)
        arm = next((arm for arm in self.arms if arm.matches(layer)), None)
        if arm is None:
            raise at.type_error(self, layer)
        return arm.merge(base if arm.matches(base) else None, layer, dataclasses.replace(at, nullable=self.nullable))

    def build(self, data: Any, key: str) -> Any:
        arm = next((arm for arm in self.arms if arm.matches(data)), None)
        return data if arm is None else arm.build(data, key)

    def children(self) -> Iterator[tuple[str, Kind]]:
        for arm in self.arms:
            yield from arm.children()


def is_none(kind: Kind) -> bool:
    return isinstance(kind, ScalarKind) and kind.kind is type(None)


class ListKind(Kind):
    def __init__(self, item: Kind) -> None:
        self.item = item

    def matches(self, value: Any) -> bool:
        return isinstance(value, list) and all(self.item.matches(v) for v in value)

    def describe(self) -> str:
        return f"a list of {self.item.describe()}"

    def coerce(self, value: Any) -> Any:
        return [self.item.coerce(v) for v in value] if isinstance(value, list) else value

    def merge(self, base: Any, layer: Any, at: Place) -> Any:
        """A list of sections (``checkpoint.model_bank``) is merged element by element onto their defaults, so that
        an unknown or mistyped key names its element; any other list as a whole."""
        if isinstance(layer, list) and any(True for _ in self.item.children()):
            places = [dataclasses.replace(at, key=f"{at.key}[{index}]", nullable=False) for index in range(len(layer))]
            return [self.item.merge(None, element, place) for element, place in zip(layer, places)]
        return super().merge(base, layer, at)

    def check(self, value: Any, at: Place) -> None:
        for index, element in enumerate(value):
            self.item.check(element, dataclasses.replace(at, key=f"{at.key}[{index}]", nullable=False))

    def build(self, data: Any, key: str) -> Any:
        return [self.item.build(value, f"{key}{index}.") for index, value in enumerate(data)]


class MapKind(Kind):
    """``dict[str, X]``: keys chosen by the user, each value an ``X``; a layer replaces the whole mapping."""

    def __init__(self, item: Kind) -> None:
        self.item = item

    def matches(self, value: Any) -> bool:
        return isinstance(value, Mapping) and all(isinstance(k, str) and self.item.matches(v) for k, v in value.items())

    def describe(self) -> str:
        return f"a mapping of {self.item.describe()}"

    def check(self, value: Any, at: Place) -> None:
        for name, element in value.items():
            self.item.check(element, at.child(name))

    def build(self, data: Any, key: str) -> Any:
        return {name: self.item.build(value, f"{key}{name}.") for name, value in data.items()}
