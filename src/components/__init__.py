"""Named components: one registry per kind of part a config chooses by name.

A config names a dense optimizer, an LR schedule, a recorder, a zoo model, a data format, a
sparse optimizer or an eviction policy (``optimizer: {name: adamw, lr: 0.001}``); whoever
defines the kind keeps its ``Registry``, and every component of it, built in or not, registers
the same way. The framework itself names none of them. A config dataclass declares the
valid range of each number in its type (``lr: PositiveFloat``), which the framework checks.
"""

from components.ranges import (
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Range,
    declared_ranges,
)
from components.registry import Component, Registry, RegistryError, import_submodules

__all__ = [
    "Component",
    "NonNegativeFloat",
    "NonNegativeInt",
    "PositiveFloat",
    "PositiveInt",
    "Range",
    "Registry",
    "RegistryError",
    "declared_ranges",
    "import_submodules",
]
