"""``GlobalBatchSize``: the type of a recipe's train batch size, by which the framework knows which key it is.

A recipe's config names its train batch size as it likes (``dataset.batch_size``, ``data.batch_size``), and its
train reader must read each data-parallel rank's share of it (``per_rank_batch_size``). A reader that reads the
whole of it on every rank trains on batches ``dp_size`` times larger than configured, without an error. Typed
``GlobalBatchSize``, the key is found here, its value checked against the ranks before the recipe builds, and
the first step checks that every rank's micro-batches hold its share (``recipes.training.step_checks``).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator
from typing import Annotated, Any

from components import Range
from recipes.errors import UserError
from recipes.training.step_checks import ConfiguredBatchSize


class _GlobalBatchSizeMark:
    """What marks a config field as the train batch size, beside its range."""

    def __repr__(self) -> str:
        return "GlobalBatchSize"


GlobalBatchSize = Annotated[int, Range(ge=1), _GlobalBatchSizeMark()]
"""A config field holding the rows of a train micro-batch over all data-parallel ranks together (each reads
``per_rank_batch_size`` of them); at most one field of a recipe's config has this type."""


def configured_batch_size(config: object) -> ConfiguredBatchSize | None:
    """The field of ``config`` (a dataclass) typed ``GlobalBatchSize``, in its sections too; ``None`` if none is."""
    found = list(_marked_fields(config, ""))
    if len(found) > 1:
        keys = ", ".join(f"`{batch_size.key}`" for batch_size in found)
        raise UserError(f"One field of a recipe's config may be typed GlobalBatchSize, but {keys} are.")
    return found[0] if found else None


def _marked_fields(section: object, prefix: str) -> Iterator[ConfiguredBatchSize]:
    hints = typing.get_type_hints(type(section), include_extras=True)
    for field in dataclasses.fields(section):  # type: ignore[arg-type]
        value: Any = getattr(section, field.name)
        if any(isinstance(extra, _GlobalBatchSizeMark) for extra in getattr(hints[field.name], "__metadata__", ())):
            yield ConfiguredBatchSize(prefix + field.name, value)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            yield from _marked_fields(value, f"{prefix}{field.name}.")
