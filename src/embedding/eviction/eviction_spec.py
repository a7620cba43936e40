"""What an eviction policy is: a config dataclass, and the spec of what a hash table's index does by it.

A policy is registered by name in :data:`EVICTION_POLICIES` with its config dataclass (an
:class:`EvictionConfig`, subclassed by a policy with options of its own) and a function of that
config to its :class:`EvictionSpec`. The CPU and the GPU index compile the spec's score into their
kernels, and a checkpoint loaded into shards too small for its ids keeps those the score ranks
highest: a policy is defined by its own module alone, and neither the indexes nor resharding name one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, Literal, get_args

from components import Registry


class EvictionConfigError(ValueError):
    """Raised when an eviction policy is configured with invalid values."""


@dataclass(frozen=True)
class EvictionConfig:
    """The eviction policy of a hash table, by ``name``; a policy with options subclasses it.

    A config checks itself when built: the policy is registered, this is its own config class, and
    each option lies in the range its type declares (as the recipe config checks the values it reads).
    """

    name: str

    def __post_init__(self) -> None:
        EVICTION_POLICIES.check_config(self, EvictionConfigError)

    def __str__(self) -> str:
        """``lru``, ``ttl, ttl_steps 100``: the policy and its options, as the start-up report lists them."""
        options = [f"{option.name} {getattr(self, option.name)}" for option in fields(self) if option.name != "name"]
        return ", ".join([self.name, *options])


WhenFull = Literal["evict", "refuse", "error"]
"""What a full shard does with an id it admits: take the slot of the lowest-scored of the slots sampled for
it (:data:`embedding.hash_probing.EVICTION_CANDIDATES`; none if all were looked up in the step), give it no
row in this step, or raise :class:`embedding.hash_index.TableFullError`."""

Score = Callable[..., Any]
"""``score(keys, last_seen, frequency, slot) -> np.int64``, a ``numba.extending.register_jitable`` function
of the index's per-slot arrays (the id a slot holds, the training step it was last looked up in, and how
many times it was): the lower, the sooner the slot's id goes. A module-level function: the kernels are
compiled once per score and cached by numba under its name, so that a new process loads them compiled."""


@dataclass(frozen=True)
class EvictionSpec:
    """What an index does under a policy: it compiles ``when_full`` and ``score`` into its kernels.

    ``score`` ranks the ids a policy gives up: a full shard that evicts takes the lowest-scored slot
    among those sampled, and a checkpoint loaded into shards of fewer slots than its ids keeps the
    highest-scored ones (the ids the policy would evict last). ``None``: the policy never chooses
    which ids go, and such a load is an error. ``expires_after``: the shard frees, before each
    step's first lookup, the slots not looked up in the last that many steps.
    """

    when_full: WhenFull
    score: Score | None = None
    expires_after: int | None = None

    def __post_init__(self) -> None:
        if self.when_full not in get_args(WhenFull):
            raise ValueError(
                f"`when_full` must be one of {', '.join(get_args(WhenFull))}, but is {self.when_full!r} instead."
            )
        if self.when_full == "evict" and self.score is None:
            raise ValueError(
                "`score` of a policy that evicts must be a register_jitable function, but is None instead."
            )


EvictionPolicy = Callable[[Any], EvictionSpec]
"""A registered policy: the function of its config to its spec."""

EVICTION_POLICIES: Registry[EvictionPolicy] = Registry("eviction policy", "recipes.eviction_policies", EvictionConfig)
"""The eviction policies of hash tables, by name: the built-in ones in :mod:`embedding.eviction`, and
those of installed packages (entry-point group ``recipes.eviction_policies``)."""


def eviction_spec(config: EvictionConfig) -> EvictionSpec:
    """The spec of the policy ``config`` names, for that config."""
    return EVICTION_POLICIES.get(config.name).value(config)
