"""The ranges numeric config fields declare in their types, and the ones most fields need.

They sit beside the registries because a component's config dataclass, wherever it is defined
(the embedding package's sparse optimizers too), declares its fields' ranges with them; the
framework's config checks them as it resolves.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from typing import Annotated


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


def declared_ranges(config_class: type) -> dict[str, tuple[type, Range]]:
    """The type and range each field of a config dataclass declares (``ttl_steps: PositiveInt``), by field:
    for a config that checks its own values when built in Python, as the framework's config checks the
    values it reads."""
    hints = typing.get_type_hints(config_class, include_extras=True)
    ranges = {}
    for field in dataclasses.fields(config_class):
        hint = hints[field.name]
        declared = [extra for extra in getattr(hint, "__metadata__", ()) if isinstance(extra, Range)]
        if declared:
            ranges[field.name] = (hint.__origin__, declared[0])
    return ranges


def _number(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() and abs(bound) < 1e16 else repr(bound)


# Ranges most fields need, for sections to declare in a word.
PositiveInt = Annotated[int, Range(ge=1)]
NonNegativeInt = Annotated[int, Range(ge=0)]
PositiveFloat = Annotated[float, Range(gt=0)]
NonNegativeFloat = Annotated[float, Range(ge=0)]
