"""The Trainer's checkpoints: when the config says what to save, how a run resumes, and ``init_from``.

The ``checkpoint`` package knows how to write and keep checkpoints; this module knows what a
training run puts in them and how it comes back from one.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import fsspec
import torch

from checkpoint import CheckpointManager, CheckpointMetadata, CheckpointPolicy, LoadedCheckpoint
from embedding import TABLE_DTYPES
from gang import FakeGang, Gangs
from recipes.checkpointing.deltas import rank_state
from recipes.checkpointing.left_out import WHY, SaveFilter, check_left_out, fill_for_resume, forget_optimizer_state
from recipes.checkpointing.model_bank import ModelBank
from recipes.config.resolution import ConfigError, to_dict
from recipes.config.sections import CheckpointSection, ModelBankSource, RecipeConfig
from recipes.recorders.base import flatten
from recipes.training.trainer import Trainer

log = logging.getLogger(__name__)

# Keys a resumed run may change: they extend the run, change only what is recorded or kept, change
# the parallel layout (batch sizes are global, so the same config trains the same on any number of
# ranks), or change where or how a step runs but not what it computes.
RESUMABLE_CHANGES = (
    "trainer.max_num_steps",
    "trainer.max_num_data_epochs",
    "trainer.max_num_windows",
    "trainer.pipeline",
    "trainer.keep_freed_memory",
    "trainer.lower_better",  # unset, or the saved (resolved) direction: checked apart, _refuse_a_flipped_direction
    "trainer.device",  # checkpoints load to the CPU, then move: a run trained on a GPU goes on on a CPU
    "metrics.",
    "profiler.",
    "checkpoint.",
    "gang.",
    "validation.batch_size",
    "dataset.parse_threads",  # the same rows in the same order, parsed on more threads
)


def checkpoint_policy(config: RecipeConfig) -> CheckpointPolicy:
    """The keep policy of ``config``, whose ``trainer.lower_better`` must be resolved (``training.score``) where it
    ranks: a run's ``config.yaml`` records it so, and ``train`` ranks its saves by the resolved config. Unresolved
    (``None``: a preset's, before its metrics are built), the policy refuses to rank scored checkpoints."""
    section, lower_better = config.checkpoint, config.trainer.lower_better
    policy = CheckpointPolicy if lower_better is not None else UnresolvedDirection
    return policy(
        keep_last_n=section.keep_last_n,
        keep_best_n=section.keep_best_n,
        keep_every_n_steps=section.keep_every_n_steps,
        lower_better=bool(lower_better),
    )


class UnresolvedDirection(CheckpointPolicy):
    """A keep policy whose score direction is not known: it keeps as ``CheckpointPolicy`` does, but refuses to rank
    scored checkpoints, which it could rank only by a guess (once, ``eval PRESET OUTPUT_DIR --checkpoint best`` of a
    run scored by a loss loaded the checkpoint of the highest loss)."""

    def ranked_by_score(self, checkpoints: Sequence[CheckpointMetadata]) -> list[CheckpointMetadata]:
        if any(checkpoint.score is not None for checkpoint in checkpoints):
            raise RuntimeError(
                "Scored checkpoints must be ranked by the direction of the score's metric, but "
                "`trainer.lower_better` is not resolved (training.score resolves it once the recipe's metrics are "
                "built): ranked by a guess, the worst checkpoint could pass for the best."
            )
        return []


def checkpoint_manager(config: RecipeConfig, output_dir: str, gangs: Gangs, clean_up: bool = True) -> CheckpointManager:
    """The manager of the run's checkpoints; ``clean_up=False`` for readers of another job's directory."""
    if config.checkpoint.keep_best_n is not None and config.trainer.score_metric is None:
        raise ConfigError("`checkpoint.keep_best_n` ranks checkpoints by `trainer.score_metric`, which must be set.")
    return CheckpointManager(
        f"{output_dir}/checkpoints",
        gangs.root,
        checkpoint_policy(config),
        gang_sizes=gang_sizes(gangs),
        clean_up=clean_up,
    )


class TrainerCheckpointer:
    """Saves what the Trainer hands over, as the ``checkpoint`` section asks."""

    def __init__(
        self,
        manager: CheckpointManager,
        section: CheckpointSection,
        config: RecipeConfig,
        save_filter: Callable[[str], bool] | None = None,
    ) -> None:
        self._manager = manager
        self._section = section
        self._config = to_dict(config)
        self._filter = SaveFilter(section.exclude, save_filter)
        self._base: int | None = None
        """The step of this run's last checkpoint whose sparse tables were saved whole (none yet after a resume)."""
        self._deltas_since_base = 0

    def delta_base(self, step_nr: int) -> int | None:
        """The last whole checkpoint, while fewer than ``checkpoint.full_every - 1`` deltas lie over it."""
        base = self._base
        if base is None or base >= step_nr or self._deltas_since_base >= self._section.full_every - 1:
            return None
        return base

    def save(
        self,
        step_nr: int,
        score: float | None,
        shared_state: dict[str, Any],
        rank_state: dict[str, Any],
        last: bool,
        unchanged_until_staged: Callable[[torch.Tensor], bool],
        interrupted: bool = False,
        base_step: int | None = None,
    ) -> None:
        mode = self._section.model_only
        model_only = mode == "all" or (mode == "all_but_last" and not last)
        if model_only:  # The model: its dense part, and its sparse tables, which are sharded.
            shared_state, rank_state = {"model": shared_state["model"]}, {"sharded": rank_state["sharded"]}
        left_out: dict[str, Any] = {}
        if self._filter.active:
            shared_state, rank_state, names = self._filter.apply(shared_state, rank_state)
            left_out = {"left_out": names}
        self._manager.save(
            step_nr,
            shared_state,
            rank_state,
            score=score,
            model_only=model_only,
            extras={"config": self._config, **left_out, **({"interrupted": True} if interrupted else {})},
            blocking=last or not self._section.async_save,
            unchanged_until_staged=unchanged_until_staged,
            base_step=base_step,
        )
        if base_step is None:
            self._base, self._deltas_since_base = step_nr, 0
        else:
            self._deltas_since_base += 1

    def use_save_filter(self, save_filter: Callable[[str], bool] | None) -> None:
        """Also leave out what the recipe's ``save_filter`` refuses (its parts are built after this checkpointer)."""
        self._filter = SaveFilter(self._section.exclude, save_filter)

    def wait_until_staged(self) -> None:
        self._manager.wait_until_staged()

    def close(self) -> None:
        """Wait for a save still being written in the background, then prune once more what was kept while it was
        read."""
        self._manager.close()


def find_resume_checkpoint(manager: CheckpointManager, config: RecipeConfig) -> LoadedCheckpoint | None:
    """The newest intact resumable checkpoint, after checking that the config allows resuming from it.

    Collective. Damaged checkpoints met on the way are moved aside, each with a warning, and an
    older one is resumed: a damaged last checkpoint costs the steps since the one before, not the run.
    """
    loaded = manager.load_newest_intact()
    if loaded is None:
        return None
    step = loaded.step
    check_left_out(loaded)
    saved = loaded.metadata.extras.get("config")
    if saved is not None:
        changed = changed_keys(saved, to_dict(config))
        if changed:
            raise ConfigError(
                f"The output directory holds a checkpoint of step {step} trained with another config "
                f"(changed: {', '.join(changed)}). Use a new output directory, revert those keys, "
                "or set checkpoint.start_over=true to train from scratch."
            )
        _check_extended_steps(saved["trainer"]["max_num_steps"], config, step)
        _refuse_a_flipped_direction(saved["trainer"].get("lower_better"), config.trainer.lower_better, step)
    return loaded


def _check_extended_steps(saved_max_steps: int | None, config: RecipeConfig, step: int) -> None:
    """A resumed run may train on past its old ``max_num_steps``, but not with a learning rate that decays over it
    (the rate would jump to where the longer schedule is), nor stop before the step it resumes from."""
    max_steps = config.trainer.max_num_steps
    if max_steps is not None and max_steps < step:
        raise ConfigError(
            f"`trainer.max_num_steps` must be at least {step}, the step of the checkpoint the run resumes from, "
            f"but is {max_steps} instead: nothing would train."
        )
    if max_steps != saved_max_steps and config.lr_scheduler.decays_over_max_num_steps:
        raise ConfigError(
            f"`trainer.max_num_steps` must stay {saved_max_steps} to resume this run, but is {max_steps} instead: "
            f"`lr_scheduler.name: {config.lr_scheduler.name}` decays the learning rate over it, so the rate would "
            "jump at the resumed step. Use checkpoint.init_from in a new output directory to train on longer."
        )


def _refuse_a_flipped_direction(saved: bool | None, configured: bool | None, step: int) -> None:
    """A resumed run may leave ``trainer.lower_better`` unset (the score's metric gives the saved direction again)
    but not flip it: the best score, early stopping's memory and the kept checkpoints were ranked the saved way,
    and a metric that does not say its direction (a ``Mean``) would take the new one without a word."""
    if saved is not None and configured is not None and configured != saved:
        raise ConfigError(
            f"`trainer.lower_better` must stay {str(saved).lower()} to resume from the checkpoint of step {step}, "
            f"but is {str(configured).lower()} instead: its best score, early stopping and kept checkpoints were "
            "ranked the other way. Use a new output directory, or set checkpoint.start_over=true to train from scratch."
        )


_TABLE_DTYPES = (None, *TABLE_DTYPES)
"""The values of a sparse table's ``dtype`` key (``None``: a per-table key that takes its section's)."""


def changed_keys(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Keys whose values differ, other than those a resumed run may change: besides ``RESUMABLE_CHANGES``, the dtype of
    sparse tables' rows (a ``dtype`` key from one table dtype to another), which loading converts and states."""
    # Sorted keys everywhere, so that a list of groups saved as JSON compares equal to the same groups now.
    old, new = (flatten(json.loads(json.dumps(config, sort_keys=True))) for config in (saved, current))
    keys = sorted(set(old) | set(new))
    return [
        k
        for k in keys
        if old.get(k) != new.get(k)
        and not k.startswith(RESUMABLE_CHANGES)
        and not (k.rpartition(".")[2] == "dtype" and old.get(k) in _TABLE_DTYPES and new.get(k) in _TABLE_DTYPES)
    ]


def resume(trainer: Trainer[Any], loaded: LoadedCheckpoint, gangs: Gangs) -> None:
    """Restore the trainer from ``loaded``, saved by this or another number of ranks.

    A rank of a job of the same size takes its own old state. With another size, rank ``r``
    takes old rank ``r``'s state if there is one, else old rank 0's: the data position and
    RNG of a replica are the best guess there is.
    """
    rank = gangs.root.rank
    if loaded.num_ranks != gangs.root.size:
        log.warning(
            "Resuming a checkpoint of %d ranks on %d: rank %d takes old rank %d's data position and RNG.",
            loaded.num_ranks,
            gangs.root.size,
            rank,
            rank if rank < loaded.num_ranks else 0,
        )
    own, pieces = rank_states_to_load(loaded, gangs)
    fresh: list[str] = []
    if loaded.metadata.extras.get("left_out"):
        pieces = list(pieces)
        fresh = fill_for_resume(trainer.state, loaded, pieces)
        if fresh:
            line = (
                f"Resuming from step {loaded.step}: its checkpoint left out {len(fresh)} parameters and tables "
                f"({WHY}), re-initialised with fresh optimizer state: {', '.join(fresh)}."
            )
            log.info(line)
            if rank == 0:
                print(line)
    trainer.load_state(loaded.shared_state, own, pieces)
    forget_optimizer_state(trainer.state.model, trainer.state.optimizer, fresh)
    log.info("Resumed from the checkpoint of step %d.", loaded.step)


def gang_sizes(gangs: Gangs) -> dict[str, int]:
    return {"root": gangs.root.size, "dp": gangs.dp.size, "tp": gangs.tp.size}


def rank_states_to_load(loaded: LoadedCheckpoint, gangs: Gangs) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """This rank's old state, and the old rank states its sharded state is rebuilt from.

    In the layout that saved the checkpoint (the same gang sizes, so the same plan puts the
    same rows on each rank) a rank's own file holds exactly its rows, and it reads no other.
    In another layout every rank reads every old rank's file and keeps the rows it now owns.
    """
    rank = gangs.root.rank
    if dict(loaded.metadata.gang_sizes) == gang_sizes(gangs):
        own = rank_state(loaded, rank)
        return own, [own]
    all_ranks = all_rank_states(loaded)
    return all_ranks[rank if rank < loaded.num_ranks else 0], all_ranks


def all_rank_states(loaded: LoadedCheckpoint) -> list[dict[str, Any]]:
    """The rank states of every rank of the job that saved ``loaded``."""
    return [rank_state(loaded, k) for k in range(loaded.num_ranks)]


def model_bank_sources(section: CheckpointSection) -> list[tuple[str, ModelBankSource]]:
    """The run's model-bank sources with the config key that names each: ``init_from`` (with its old
    ``init_include``/``init_exclude``/``init_strict``) first, then ``model_bank``'s."""
    sources = []
    if section.init_from is not None:
        legacy = ModelBankSource(
            path=section.init_from,
            load=list(section.init_include),
            exclude=list(section.init_exclude),
            ignore_missing=not section.init_strict,
        )
        sources.append(("checkpoint.init_from", legacy))
    sources += [(f"checkpoint.model_bank[{index}]", source) for index, source in enumerate(section.model_bank)]
    return sources


def build_model_bank(
    model: torch.nn.Module, sharded_state: Mapping[str, Any], section: CheckpointSection, gangs: Gangs
) -> ModelBank:
    """The run's model bank (``init_from`` included), for the start and the Trainer's periodic reloads."""
    return ModelBank(
        model_bank_sources(section),
        model,
        sharded_state,
        gangs.root,
        every_n_steps=section.reload_every_n_steps,
        every_n_data_epochs=section.reload_every_n_data_epochs,
        every_n_windows=section.reload_every_n_windows,
    )


def initialize_from(
    model: torch.nn.Module, sharded_state: Mapping[str, Any], section: CheckpointSection, gangs: Gangs | None = None
) -> None:
    """Load the model bank's sources into a run that starts from step 0 (``init_from`` and ``model_bank``).

    Patterns match parameter names (``mlp.0.weight``) and sparse tables as ``<sharded state>.<table>``
    (``embeddings.cat_0``); see ``recipes.checkpointing.model_bank``.
    """
    gang = gangs.root if gangs is not None else FakeGang()
    ModelBank(model_bank_sources(section), model, sharded_state, gang).load()


def set_earlier_metrics_aside(output_dir: str, loaded: LoadedCheckpoint | None, gangs: Gangs) -> None:
    """Move an earlier run's ``metrics/`` and ``tb/`` to ``metrics.old-<n>/`` and ``tb.old-<n>/`` when
    training starts from step 0 (``loaded`` is None) in a used output directory.

    A run killed before its first checkpoint leaves metric rows and events that the new run
    records again from step 0: appended to, the history would hold every step twice. Resumed
    runs need none of this, as their recorders drop what lies past the resumed step. Moved, not
    deleted: they are the user's record of what happened. Rank 0 alone records metrics.
    """
    if loaded is not None or gangs.root.rank != 0:
        return
    fs, root = fsspec.core.url_to_fs(output_dir)
    used = [name for name in ("metrics", "tb") if fs.isdir(f"{root}/{name}") and fs.find(f"{root}/{name}")]
    if not used:
        return
    number = 1
    while any(fs.exists(f"{root}/{name}.old-{number}") for name in ("metrics", "tb")):
        number += 1
    for name in used:
        fs.mv(f"{root}/{name}", f"{root}/{name}.old-{number}", recursive=True)
    log.warning(
        "Training starts from step 0 in a used output directory: moved the earlier %s aside to %s, "
        "so that no step is recorded twice.",
        " and ".join(f"{name}/" for name in used),
        " and ".join(f"{output_dir}/{name}.old-{number}/" for name in used),
    )


def archive_checkpoints(output_dir: str) -> None:
    """Move earlier checkpoints aside (``checkpoint.start_over``) rather than delete a user's data."""
    fs, path = fsspec.core.url_to_fs(f"{output_dir}/checkpoints")
    if fs.exists(path):
        archived = f"{path}.old-{time.strftime('%Y%m%d-%H%M%S')}"
        fs.mv(path, archived, recursive=True)
        log.warning("checkpoint.start_over: moved the earlier checkpoints to %s.", archived)
