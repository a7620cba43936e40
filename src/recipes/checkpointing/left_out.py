"""Save filters: what checkpoints leave out (``checkpoint.exclude``, a recipe's ``save_filter``), and how a resume
or a scoring command fills it back in.

A left-out parameter or table is another run's business (the model bank reloads it) or not worth keeping, so a
checkpoint drops it with its optimizer state: Adam moments of a parameter that a resume re-initialises would
drive the fresh values with the old run's gradients. The run's own state (the optimizer's, the reader's
position, the counters...) cannot be re-created, so a checkpoint without it is refused for a resume.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Any

from torch import nn
from torch.optim import Optimizer

from checkpoint import LoadedCheckpoint
from embedding import CombinedOptimizer, ShardedEmbeddingCollection
from recipes.errors import ConfigError
from recipes.training.parallel import load_model_state, model_state, optimizer_state, unwrap
from recipes.training.protocols import ShardedStateful
from recipes.training.trainer_state import TrainingState, load_sharded_state

log = logging.getLogger(__name__)

RUN_STATE = {
    "optimizer": "the optimizer's state",
    "lr_scheduler": "the LR scheduler's state",
    "grad_scaler": "the loss scaler's state",
    "trainer": "the trainer's counters",
    "early_stopper": "the early stopper's state",
    "data_reader": "the reader's position",
    "rng": "the RNG streams",
    "metrics": "the unreduced metrics",
    "unit_metrics": "the unit's unreduced metrics",
}
"""The state a resume needs besides the model, by its key in a checkpoint: a checkpoint without it cannot resume."""

WHY = "checkpoint.exclude or the recipe's save_filter"


class SaveFilter:
    """What a checkpoint leaves out: parameters and tables matching ``checkpoint.exclude`` (and a run-state key
    it names exactly, such as ``optimizer``), and whatever the recipe's ``save_filter`` refuses (it is asked
    about every parameter, table and run-state key).

    Parameters are named as in the model's state dict (``mlp.0.weight``), tables as
    ``<sharded state>.<table>`` (``embeddings.cat_0``), the run's other state by its key (``optimizer``).
    A glob never matches run state: ``exclude: ["*"]`` leaves out the model, not what a resume needs.
    """

    def __init__(self, exclude: Sequence[str], keep: Callable[[str], bool] | None = None) -> None:
        self._exclude = list(exclude)
        self._keep = keep

    @property
    def active(self) -> bool:
        return bool(self._exclude) or self._keep is not None

    def leaves_out(self, name: str, run_state: bool = False) -> bool:
        if run_state and name in self._exclude:
            return True
        if not run_state and any(fnmatchcase(name, p) for p in self._exclude):
            return True
        return self._keep is not None and not self._keep(name)

    def apply(
        self, shared: dict[str, Any], per_rank: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
        """The states without what is left out, and the names left out (on this rank: tables differ by rank).

        A left-out parameter's dense optimizer state goes too (a table's sparse state travels in its piece): a
        resume starts it afresh, as a new parameter's."""
        left_out: list[str] = []
        shared, per_rank = dict(shared), dict(per_rank)
        for key in [*shared, *per_rank]:
            if key in RUN_STATE and self.leaves_out(key, run_state=True):
                left_out.append(key)
                shared.pop(key, None)
                per_rank.pop(key, None)
        if "model" in shared:
            dropped = [name for name in shared["model"] if self.leaves_out(name)]
            shared["model"] = {n: v for n, v in shared["model"].items() if n not in dropped}
            if "optimizer" in shared and dropped:
                shared["optimizer"] = _without_state_of(shared["optimizer"], dropped)
            left_out += dropped
        if "sharded" in per_rank:
            sharded = {}
            for name, state in per_rank["sharded"].items():
                dropped = [t for t in state["tables"] if self.leaves_out(f"{name}.{t}")]
                sharded[name] = {**state, "tables": {t: v for t, v in state["tables"].items() if t not in dropped}}
                left_out += [f"{name}.{t}" for t in dropped]
            per_rank["sharded"] = sharded
        return shared, per_rank, left_out


def refuse_unmatched_exclude(
    patterns: Sequence[str], model: nn.Module, sharded_state: Mapping[str, ShardedStateful]
) -> None:
    """Stop at start-up on a ``checkpoint.exclude`` pattern that matches nothing: a misspelt name would leave in
    the checkpoints what the user meant to keep out, silently.

    :raises ConfigError: naming the pattern and some of the names it could match.
    """
    names = [*unwrap(model).state_dict(keep_vars=True), *_table_names(sharded_state)]
    for pattern in patterns:
        if pattern not in RUN_STATE and not any(fnmatchcase(name, pattern) for name in names):
            some = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
            raise ConfigError(
                f"`checkpoint.exclude` pattern '{pattern}' must match a parameter or table of the model, or name "
                f"run state ({', '.join(RUN_STATE)}), but matches none (the model has {some or 'nothing'})."
            )


def _table_names(sharded_state: Mapping[str, ShardedStateful]) -> list[str]:
    """Every table as a checkpoint names it: all of a collection's tables, whichever rank holds them."""
    names = []
    for name, stateful in sharded_state.items():
        if isinstance(stateful, ShardedEmbeddingCollection):
            held = [table.name for table in stateful.tables]
        else:
            held = list(stateful.sharded_state_dict()["tables"])
        names += [f"{name}.{table}" for table in held]
    return names


def _dense(state: Mapping[str, Any]) -> Mapping[str, Any]:
    """The dense optimizer's full state dict in a checkpoint's ``optimizer`` (``parallel.optimizer_state``)."""
    return state["dense"] if "param_groups" not in state and "dense" in state else state


def _without_state_of(state: Mapping[str, Any], names: Sequence[str]) -> dict[str, Any]:
    dense = _dense(state)
    kept = {**dense, "state": {n: v for n, v in dense["state"].items() if n not in names}}
    return {**state, "dense": kept} if dense is not state else kept


def check_left_out(loaded: LoadedCheckpoint) -> list[str]:
    """What a save filter left out of ``loaded``, after refusing a resume that would lose run state.

    :raises ConfigError: when the checkpoint lacks state a resume needs (the optimizer's, the reader's...):
        resuming would go on with fresh state there, silently.
    """
    left_out = list(loaded.metadata.extras.get("left_out", []))
    lost = [key for key in RUN_STATE if key in left_out]
    if lost:
        raise ConfigError(
            f"The checkpoint of step {loaded.step} must hold every state a resume needs, but its save filter left "
            f"out {', '.join(RUN_STATE[k] for k in lost)}: "
            "resuming would lose it. Start in a new output directory (checkpoint.init_from to take its model), "
            "or set checkpoint.start_over=true."
        )
    return left_out


def fill_model(
    model: nn.Module, sharded_state: Mapping[str, ShardedStateful], loaded: LoadedCheckpoint, pieces: list[Any]
) -> list[str]:
    """Put the model's current (freshly initialised) values where ``loaded`` left parameters or tables out, so
    that loading it re-initialises exactly them; returns their names (parameters first).

    ``pieces`` are the saving ranks' states the sharded state loads from: a piece of this rank's own tables is
    added for the tables none of them holds.
    """
    shared = loaded.shared_state
    current = model_state(model)
    missing = [name for name in current if name not in shared["model"]]
    shared["model"] = {**shared["model"], **{name: current[name] for name in missing}}
    fresh: dict[str, Any] = {}
    for name, stateful in sharded_state.items():
        saved = {t for piece in pieces for t in piece["sharded"].get(name, {}).get("tables", {})}
        tables = {t: v for t, v in stateful.sharded_state_dict()["tables"].items() if t not in saved}
        fresh[name] = {"tables": tables}
        missing += [f"{name}.{t}" for t in tables]
    if any(state["tables"] for state in fresh.values()):
        pieces.append({"sharded": fresh})
    return missing


def fill_for_resume(state: TrainingState, loaded: LoadedCheckpoint, pieces: list[Any]) -> list[str]:
    """:func:`fill_model` for a resume, and stand-ins for the left-out parameters' optimizer state (a full
    optimizer state must cover every parameter to load); :func:`forget_optimizer_state` drops them after."""
    missing = fill_model(state.model, state.sharded, loaded, pieces)
    saved = _dense(loaded.shared_state["optimizer"])["state"]
    current = _dense(optimizer_state(state.model, state.optimizer))["state"]
    saved.update({name: current[name] for name in missing if name in current and name not in saved})
    return missing


def forget_optimizer_state(model: nn.Module, optimizer: Optimizer, names: Sequence[str]) -> None:
    """Drop the dense optimizer's state of the parameters ``names``: its next step creates it afresh (zero
    moments, step 0), as for a parameter that has never trained."""
    dense = optimizer.dense if isinstance(optimizer, CombinedOptimizer) else optimizer
    params = dict(unwrap(model).named_parameters())
    for name in names:
        if name in params:
            dense.state.pop(params[name], None)


def load_model_of(
    loaded: LoadedCheckpoint,
    model: nn.Module,
    sharded_state: Mapping[str, ShardedStateful],
    pieces: Sequence[Any],
) -> None:
    """Load a checkpoint's model and tables for scoring (``eval``, ``predict``, ``importance``...): what it left
    out is freshly initialised, as a resume does, and said so in one line, a warning."""
    all_pieces = list(pieces)
    fresh = fill_model(model, sharded_state, loaded, all_pieces) if loaded.metadata.extras.get("left_out") else []
    if fresh:
        line = (
            f"The checkpoint of step {loaded.step} left out {len(fresh)} parameters and tables ({WHY}); they "
            f"score as freshly initialised: {', '.join(fresh)}."
        )
        log.warning(line)  # On the console too, as every warning.
    load_model_state(model, loaded.shared_state["model"])
    load_sharded_state(sharded_state, all_pieces)
