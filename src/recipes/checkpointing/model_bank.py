"""The model bank: chosen parameters and sparse-table rows of other runs' checkpoints, loaded into this run's model.

A production model is rarely trained alone: its user tower comes from one model, its item tables from
another, each trained on. RecIS calls the sources a ``model_bank`` and reloads them every
``load_update_steps``; here ``checkpoint.model_bank`` lists them (``checkpoint.init_from`` is one such
source, loaded once), each loaded at the start and again every ``checkpoint.reload_every_n_*``, always
from the source's newest intact checkpoint: the source run may be training and saving meanwhile.

Names are those of the source: parameters by their state-dict name (``mlp.0.weight``), sparse tables as
``<sharded state>.<table>`` (``embeddings.cat_0``). ``load``/``exclude`` globs choose among them,
``rename`` moves a prefix to this model's name, and every chosen name must land on a parameter or table
of this model of the same shape (``ignore_missing`` turns a miss into a warning). Table rows travel
with their ids, so that any number of ranks on either side works: a fixed table's rows by their global
row range, a hash table's by its ids, merged into the rows this run has (or into a cleared table, for
``reset_tables``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from functools import partial
from typing import Any

import fsspec
import numpy as np
import torch
from torch import nn

from checkpoint import CheckpointError, CheckpointManager, LoadedCheckpoint
from checkpoint.errors import CorruptCheckpointError
from gang import FakeGang, Gang, ReduceOperation
from recipes.checkpointing import deltas
from recipes.config.sections import ModelBankSource
from recipes.training.parallel import load_model_state, model_state
from recipes.training.protocols import ShardedStateful

log = logging.getLogger(__name__)

_PER_SLOT = ("slots", "keys", "last_seen", "frequency")
"""The index arrays of a hash-table piece with one entry per saved row (``embedding.dynamic_state``)."""


class ModelBankError(CheckpointError):
    """A model-bank source or its selection does not fit the source's checkpoint or this model."""


@dataclass(frozen=True)
class SourceState:
    """What one load reads of a source's checkpoint: its model state and every saving rank's sharded state."""

    where: str
    """The step directory read, for log lines and errors."""
    step: int
    model: Mapping[str, Any]
    sharded: Sequence[Mapping[str, Any]]
    """Per old rank: ``{sharded state name: {"tables": {table: piece}}}``."""

    def table_names(self) -> list[str]:
        """Every table of the source as ``<sharded state>.<table>``, from the pieces of all its ranks."""
        return sorted({f"{name}.{table}" for rank in self.sharded for name, s in rank.items() for table in s["tables"]})


def checkpoints_root(path: str) -> tuple[str, int | None]:
    """The checkpoints directory of ``path`` (an output dir, a ``checkpoints`` dir, or a ``step_N`` dir) and
    the step it names, if it names one."""
    path = path.rstrip("/")
    root, _, leaf = path.rpartition("/")
    if leaf.startswith("step_") and leaf[5:].isdigit():
        return root, int(leaf[5:])
    fs, plain = fsspec.core.url_to_fs(path)
    if fs.isdir(f"{plain}/checkpoints"):
        return f"{path}/checkpoints", None
    return path, None


def read_newest_intact(path: str, gang: Gang, what: str) -> SourceState:
    """The newest checkpoint of ``path`` whose files check out on every rank, the same step on every rank.

    Collective. Rank 0 lists the candidate steps (the source may be saving and pruning meanwhile, so
    ranks that listed alone could disagree); each rank reads the candidate in full, and a checkpoint
    that any rank found damaged or gone is passed over for the next older one. ``what`` names the
    config key, for errors.
    """
    root, step = checkpoints_root(path)
    manager = CheckpointManager(root, FakeGang(), clean_up=False)
    candidates: list[int] = []
    if gang.rank == 0:
        candidates = [step] if step is not None else sorted((c.step for c in manager.list_checkpoints()), reverse=True)
    candidates = gang.broadcast_object(candidates) if gang.size > 1 else candidates
    if not candidates:
        raise ModelBankError(f"`{what}` must name a run or checkpoint, but {path} holds no checkpoint.")
    for candidate in candidates:
        state: SourceState | None = None
        problem: str | None = None
        try:
            state = manager.read(partial(_same, candidate), partial(_read, manager))  # Held against its prunes.
        except (CorruptCheckpointError, FileNotFoundError) as ex:
            problem = str(ex)
        except CheckpointError as ex:  # Gone (pruned by the source run since it was listed), or not a checkpoint.
            problem = str(ex)
        problems = gang.all_gather_object(problem) if gang.size > 1 else [problem]
        if not any(problems):
            assert state is not None
            return state
        log.warning("Model bank: skipping step %d of %s: %s", candidate, path, next(p for p in problems if p))
    raise ModelBankError(f"`{what}` must name a run or checkpoint, but {path} holds no intact checkpoint.")


def _same(step: int) -> int:
    """The choice of a candidate step: itself, and if it is pruned before it is held, gone (the next one is tried)."""
    return step


def _read(manager: CheckpointManager, step: int) -> SourceState:
    loaded: LoadedCheckpoint = manager.load(step, keys=["model"])
    ranks = [deltas.rank_state(loaded, k).get("sharded", {}) for k in range(loaded.num_ranks)]
    return SourceState(f"{manager.root}/step_{step}", step, loaded.shared_state["model"], ranks)


@dataclass(frozen=True)
class Selection:
    """What one source gives this model: ``{this model's name: the source's name}``, for parameters and tables."""

    dense: dict[str, str]
    tables: dict[str, str]


def select(
    source: ModelBankSource,
    state: SourceState,
    model_names: Mapping[str, tuple[int, ...] | None],
    table_names: Sequence[str],
    what: str,
) -> Selection:
    """The parameters and tables ``source`` loads from ``state`` into a model with these names (and shapes).

    :raises ModelBankError: for a ``load`` glob matching nothing of the source, a rename onto a name the
        source has, two names landing on one, or a name this model lacks or holds in another shape (the
        last two only warned about with ``ignore_missing``).
    """
    source_dense = list(state.model)
    source_tables = state.table_names()
    everything = [*source_dense, *source_tables]
    if not source.ignore_missing:
        for pattern in source.load:
            if not any(fnmatchcase(name, pattern) for name in everything):
                raise ModelBankError(
                    f"`{what}.load` pattern '{pattern}' must match a parameter or table of {state.where}, "
                    f"but matches none (it has {_some(everything)})."
                )
    chosen = [n for n in everything if _selected(n, source.load, source.exclude)]
    renamed = {name: rename(name, source.rename) for name in chosen}
    existing = set(everything)
    targets: dict[str, str] = {}
    for name, target in renamed.items():
        if target != name and target in existing and rename(target, source.rename) == target:
            raise ModelBankError(
                f"`{what}.rename` must move names onto names the source does not have, but moves '{name}' "
                f"onto '{target}', which {state.where} has too."
            )
        if target in targets:
            raise ModelBankError(
                f"`{what}.rename` must give every loaded name its own, but moves both '{targets[target]}' and "
                f"'{name}' onto '{target}'."
            )
        targets[target] = name
    tables = set(table_names)
    dense = {t: s for t, s in targets.items() if s in state.model}
    sharded = {t: s for t, s in targets.items() if s not in state.model}
    problems = _problems(state, dense, sharded, model_names, tables, source)
    if problems and not source.ignore_missing:
        raise ModelBankError(f"The selection of `{what}` must fit the model, but has entries " + "; ".join(problems))
    if problems:
        log.warning("Model bank: %s leaves out entries %s.", state.where, "; ".join(problems))
    return Selection(
        dense={t: s for t, s in dense.items() if _shape(state.model[s]) == model_names.get(t, ())},
        tables={t: s for t, s in sharded.items() if t in tables},
    )


def _problems(
    state: SourceState,
    dense: Mapping[str, str],
    sharded: Mapping[str, str],
    model_names: Mapping[str, tuple[int, ...] | None],
    tables: set[str],
    source: ModelBankSource,
) -> list[str]:
    """What keeps a selection from fitting: names the model lacks, names it lacks a source for, other shapes."""
    unexpected = sorted([t for t in dense if t not in model_names] + [t for t in sharded if t not in tables])
    mismatched = sorted(t for t, s in dense.items() if t in model_names and _shape(state.model[s]) != model_names[t])
    # A name of this model that the globs choose (and no rename touches) must come from the source.
    prefixes = [*source.rename, *source.rename.values()]
    wanted = [
        n
        for n in [*model_names, *tables]
        if _selected(n, source.load, source.exclude) and not any(n.startswith(p) for p in prefixes)
    ]
    missing = sorted(n for n in wanted if n not in dense and n not in sharded)
    problems = []
    if missing:
        problems.append(f"missing from the source: {missing}")
    if unexpected:
        problems.append(f"not in the model: {unexpected}")
    if mismatched:
        shapes = [f"{n} {_shape(state.model[dense[n]])} vs {model_names[n]}" for n in mismatched]
        problems.append(f"with other shapes (source vs model): {shapes}")
    return problems


def rename(name: str, rules: Mapping[str, str]) -> str:
    """``name`` with the longest prefix that a rule names replaced by the rule's new prefix."""
    for old in sorted(rules, key=len, reverse=True):
        if name.startswith(old):
            return rules[old] + name[len(old) :]
    return name


def _selected(name: str, load: Sequence[str], exclude: Sequence[str]) -> bool:
    return any(fnmatchcase(name, p) for p in load) and not any(fnmatchcase(name, p) for p in exclude)


def _shape(value: Any) -> tuple[int, ...] | None:
    return tuple(value.shape) if isinstance(value, torch.Tensor) else None


def _some(names: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "") if names else "nothing"


# Loading ----------------------------------------------------------------------------------------------


def load_source(
    source: ModelBankSource,
    model: nn.Module,
    sharded_state: Mapping[str, ShardedStateful],
    gang: Gang,
    what: str,
) -> Selection:
    """Load what ``source`` selects from its newest intact checkpoint into ``model`` and ``sharded_state``.

    Collective: every rank reads the same step and takes the rows it owns. Logs what came from where.
    """
    state = read_newest_intact(source.path, gang, what)
    current = model_state(model)
    own = {name: stateful.sharded_state_dict()["tables"] for name, stateful in sharded_state.items()}
    table_names = [f"{name}.{table}" for name, tables in own.items() for table in tables]
    selection = select(source, state, {n: _shape(v) for n, v in current.items()}, table_names, what)
    reset = _reset_tables(source, own, what)
    if selection.dense:
        current.update({target: state.model[name] for target, name in selection.dense.items()})
        load_model_state(model, current)
    for name, stateful in sharded_state.items():
        chosen = {t.partition(".")[2]: s for t, s in selection.tables.items() if t.partition(".")[0] == name}
        if chosen:
            stateful.load_sharded_state_dict(_pieces(chosen, own[name], state.sharded, reset, name, gang))
    log.info(
        "Model bank: loaded %d parameters and %d tables from %s (%s).",
        len(selection.dense),
        len(selection.tables),
        state.where,
        _some(sorted([*selection.dense, *selection.tables])),
    )
    return selection


def _reset_tables(source: ModelBankSource, own: Mapping[str, Mapping[str, Any]], what: str) -> set[str]:
    """The hash tables (``<sharded state>.<table>``) that ``reset_tables`` clears before they load."""
    reset = set()
    for pattern in source.reset_tables:
        matched = [f"{n}.{t}" for n, tables in own.items() for t in tables if fnmatchcase(f"{n}.{t}", pattern)]
        if not matched:
            raise ModelBankError(f"`{what}.reset_tables` pattern '{pattern}' must match a table, but matches none.")
        for name in matched:
            state_name, _, table = name.partition(".")
            if own[state_name][table].get("kind") != "hash":
                raise ModelBankError(
                    f"`{what}.reset_tables` must name hash tables, but '{name}' is a fixed table: its rows are "
                    "all loaded anyway."
                )
            reset.add(name)
    return reset


def _pieces(
    chosen: Mapping[str, str],
    own: Mapping[str, Any],
    sources: Sequence[Mapping[str, Any]],
    reset: set[str],
    state_name: str,
    gang: Gang,
) -> list[dict[str, Any]]:
    """The pieces that load the ``chosen`` tables (``{this model's table: source name}``) from every source
    rank, and leave every other table as this rank has it.

    A hash table is resharded from the source's pieces and, unless reset, this rank's own ids that the
    source lacks: the source's rows win, the run's other ids stay. Its counters (admitted, evicted...)
    and sketch stay the run's, as they describe this run's data.
    """
    pieces: list[dict[str, Any]] = []
    source_keys: dict[str, list[np.ndarray]] = {table: [] for table in chosen}
    for rank_state in sources:
        tables = {}
        for table, name in chosen.items():
            source_state, _, source_table = name.partition(".")
            piece = rank_state.get(source_state, {}).get("tables", {}).get(source_table)
            if piece is None:
                continue
            if own[table].get("kind") == "hash" and piece.get("kind") == "hash":
                piece = _as_source_piece(piece, own[table])
                source_keys[table].append(piece["index"]["keys"].numpy())
            tables[table] = piece
        pieces.append({"tables": tables})
    kept = {table: piece for table, piece in own.items() if table not in chosen}
    for table in sorted(chosen):  # The same order on every rank: the counters are summed over them.
        piece = own[table]
        if piece.get("kind") != "hash":
            continue
        keys = piece["index"]["keys"].numpy()
        keep = np.zeros(keys.size, dtype=bool)
        if f"{state_name}.{table}" not in reset:
            keep = ~np.isin(keys, np.concatenate(source_keys[table]) if source_keys[table] else np.empty(0, np.int64))
        kept[table] = _own_carrier(piece, keep, gang)
    pieces.append({"tables": kept})
    return pieces


def _as_source_piece(piece: Mapping[str, Any], own: Mapping[str, Any]) -> dict[str, Any]:
    """A source's hash-table piece as a reload takes it: resharded by id (never restored slot for slot), at
    this run's step, adding nothing to the run's counts.

    Its sparse optimizer state takes the run's layout, as every piece of a reshard must: none where the run
    has allocated none yet (a load at the start, before the optimizer exists), zeros for a state the source's
    optimizer does not keep."""
    index = dict(piece["index"])
    index["step"] = own["index"]["step"]
    index["sketch"] = torch.zeros_like(index["sketch"])
    index["counters"] = torch.zeros_like(index["counters"])
    num_rows = int(piece["weight"].size(0))
    theirs = piece["optimizer_state"]
    optimizer_state = {
        name: theirs[name] if name in theirs else mine.new_zeros((num_rows, *mine.shape[1:]))
        for name, mine in own["optimizer_state"].items()
    }
    return {**piece, "rank": -1, "index": index, "optimizer_state": optimizer_state}


def _own_carrier(piece: Mapping[str, Any], keep: np.ndarray, gang: Gang) -> dict[str, Any]:
    """This rank's hash-table piece cut to the ids in ``keep``, carrying the counters of every rank on rank 0
    (a reshard takes rank 0's sum) and this rank's sketch."""
    index = dict(piece["index"])
    mask = torch.from_numpy(keep)
    for key in _PER_SLOT:
        index[key] = index[key][mask]
    counters = index["counters"].clone()
    totals = counters.to(torch.float64).to(gang.device)
    if gang.size > 1:
        gang.all_reduce(totals, ReduceOperation.SUM)
    counters[2:] = totals.cpu().to(counters.dtype)[2:] if gang.rank == 0 else 0
    index["counters"] = counters
    optimizer_state = {name: tensor[mask.to(tensor.device)] for name, tensor in piece["optimizer_state"].items()}
    return {
        **piece,
        "rank": -1,
        "weight": piece["weight"][mask.to(piece["weight"].device)],
        "optimizer_state": optimizer_state,
        "index": index,
    }


class ModelBank:
    """The model-bank sources of a run, loaded at the start and again every ``reload_every_n_*``.

    The Trainer calls :meth:`after_step` after every step and :meth:`after_window` at the end of every data
    window.
    """

    def __init__(
        self,
        sources: Sequence[tuple[str, ModelBankSource]],
        model: nn.Module,
        sharded_state: Mapping[str, ShardedStateful],
        gang: Gang,
        every_n_steps: int | None = None,
        every_n_data_epochs: int | None = None,
        every_n_windows: int | None = None,
    ) -> None:
        self._sources = list(sources)
        """``(config key, source)``: the key names the source in errors."""
        self._model = model
        self._sharded_state = sharded_state
        self._gang = gang
        self._every_n_steps = every_n_steps
        self._every_n_data_epochs = every_n_data_epochs
        self._every_n_windows = every_n_windows

    @property
    def reloads(self) -> bool:
        """Whether any periodic reload is configured."""
        periods = (self._every_n_steps, self._every_n_data_epochs, self._every_n_windows)
        return bool(self._sources) and any(period is not None for period in periods)

    def load(self) -> None:
        """Load every source, in order (a later source's names win). Collective."""
        for what, source in self._sources:
            load_source(source, self._model, self._sharded_state, self._gang, what)

    def after_step(self, step_nr: int, epoch_ended: bool, data_epoch_nr: int) -> None:
        """Reload every source when ``step_nr`` or a just-ended data epoch reaches a multiple of its period."""
        by_steps = self._every_n_steps is not None and step_nr % self._every_n_steps == 0
        by_epochs = (
            epoch_ended and self._every_n_data_epochs is not None and data_epoch_nr % self._every_n_data_epochs == 0
        )
        if by_steps or by_epochs:
            log.info("Model bank: reloading %d sources after step %d.", len(self._sources), step_nr)
            self.load()

    def after_window(self, num_windows_done: int) -> None:
        """Reload every source when the windows done reach a multiple of ``reload_every_n_windows``."""
        if self._every_n_windows is not None and num_windows_done % self._every_n_windows == 0:
            log.info("Model bank: reloading %d sources after window %d.", len(self._sources), num_windows_done)
            self.load()
