"""A job from what the user asked for: the preset's recipe and config, the gangs, the recipe's parts.

``train``, ``eval``, ``predict`` and ``export-tables`` all start here: the config is resolved the
same way (defaults < preset < files < overrides), the job's processes join their gangs with
per-rank logging, and the recipe builds its parts, which the framework checks and completes
(tensor parallelism, the model's sparse tables).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import fsspec
import numba
import torch
import yaml

from checkpoint import CheckpointInfo, CheckpointManager
from embedding import ShardedEmbeddingCollection
from gang import FakeGang, Gangs, default_device, setup_gangs
from recipes.checkpointing.run_checkpoints import checkpoint_policy
from recipes.cli.job_spec import JobSpec
from recipes.config.presets import Preset, Recipe, find_preset, recorded_imports, resolve_preset
from recipes.config.resolution import ConfigError, overrides_to_dict, resolve_config, to_dict
from recipes.config.sections import RecipeConfig
from recipes.config.text import read_yaml_file
from recipes.errors import UserError, WriteError
from recipes.runtime.allocation_guard import AllocationGuard
from recipes.runtime.host_memory import keep_freed_memory
from recipes.runtime.rng import seed_everything
from recipes.runtime.run_lock import RunLock
from recipes.runtime.threads import check_at_most_the_cores, use_threads
from recipes.training.batch_size import configured_batch_size
from recipes.training.parallel import tensor_parallel
from recipes.training.parts import RecipeContext, RecipeParts, check_units
from recipes.training.protocols import ShardedStateful
from recipes.training.sparse_tables import (
    TABLE_STORES,
    find_sparse_tables,
    place_table_stores,
    refuse_features_without_tables,
    sharded_state_with_tables,
)
from recipes.training.step_checks import ConfiguredBatchSize

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResolvedJob:
    preset: Preset
    recipe: Recipe
    config: RecipeConfig
    imports: tuple[str, ...] = ()
    """The modules the preset's whole ``based_on`` chain imports, which a re-run imports again."""
    search_path: tuple[str, ...] = ()
    """The absolute folders those imports came from."""


def resolve_job(spec: JobSpec, extra: Sequence[tuple[str, Mapping[str, Any]]] = ()) -> ResolvedJob:
    """The preset's recipe and the config from defaults < preset < files < overrides < ``extra`` layers (``(source,
    layer)``, named by their source in messages: a sweep's space)."""
    preset = find_preset(spec.preset)
    recipe, layers = resolve_preset(preset)
    imports, search_path = recorded_imports(preset)
    for path in spec.config_files:
        layers.append((f"--config-file {path}", read_config_file(path, recipe.name)))
    if spec.overrides:
        layers.append(("the command line", overrides_to_dict(list(spec.overrides))))
    layers.extend(extra)
    return ResolvedJob(preset, recipe, resolve_config(recipe.config_class, layers), imports, search_path)


def read_config_file(path: str, recipe_name: str) -> Mapping[str, Any]:
    """A config file: plain sections, or a preset-shaped file (a run's ``config.yaml``) of the same recipe."""
    if not os.path.isfile(path):
        raise UserError(f"The config file {path} does not exist.")
    try:
        data = read_yaml_file(path) or {}
    except yaml.YAMLError as ex:
        raise UserError(f"The config file {path} is not valid YAML: {ex}".replace("\n", " ")) from None
    if not isinstance(data, dict):
        raise UserError(f"The config file {path} must hold a mapping, but holds a {type(data).__name__}.")
    if "recipe" in data and "config" in data:
        if data["recipe"] != recipe_name:
            raise UserError(f"The config file {path} is for recipe '{data['recipe']}', not '{recipe_name}'.")
        data = data["config"] or {}
    return data


def config_document(job: ResolvedJob) -> dict[str, Any]:
    """The resolved config as a preset-shaped document: ``train`` and ``--config-file`` both take it back.

    It records where a user's recipe comes from (the chain's imports, and their folders as absolute
    paths), so that ``train OUTPUT_DIR/config.yaml`` finds the recipe from any directory.
    """
    document: dict[str, Any] = {"recipe": job.recipe.name}
    if job.preset.description:
        document["description"] = job.preset.description
    if job.imports:
        document["imports"] = list(job.imports)
    if job.search_path:
        document["search_path"] = list(job.search_path)
    document["config"] = to_dict(job.config)
    return document


def run_config(output_dir: str) -> RecipeConfig:
    """The config of the run in ``output_dir``, its ``config.yaml``: with the score direction the run resolved, by
    which its checkpoints were ranked and kept (a preset leaves it unset where its metric says it)."""
    path = f"{output_dir}/config.yaml"
    if not os.path.isfile(path):
        raise UserError(f"{output_dir} is not a run's output directory: it has no config.yaml.")
    return resolve_job(JobSpec(path)).config


def read_only_checkpoints(output_dir: str) -> CheckpointManager:
    """The checkpoints of the run in ``output_dir``, under the run's keep policy, read-only: a reader of a running
    job's directory must not delete its save in progress."""
    policy = checkpoint_policy(run_config(output_dir))
    return CheckpointManager(f"{output_dir}/checkpoints", FakeGang(), policy, clean_up=False)


def list_checkpoints(output_dir: str) -> list[CheckpointInfo]:
    """The checkpoints of a run, judged by the keep policy of the run's own ``config.yaml``, and the damaged
    ones (``damage`` set), which a user must be able to find since they are never deleted."""
    manager = read_only_checkpoints(output_dir)
    infos = manager.list_checkpoints() + manager.list_damaged()
    return sorted(infos, key=lambda info: (info.step, info.damage is not None, info.path))


def checkpoint_step(manager: CheckpointManager, which: str, output_dir: str) -> int:
    """The step of ``--checkpoint WHICH`` (auto, last, best or a step) among the run's committed checkpoints.

    ``auto`` is the best scored checkpoint where validation scored any (what a run with early stopping is for),
    else the last: a run whose best checkpoint is kept is then scored by it without a flag to remember."""
    steps = [info.step for info in manager.list_checkpoints()]
    if which == "auto":
        best = manager.best_step()
        step = best if best is not None else max(steps, default=None)
    elif which == "last":
        step = max(steps, default=None)
    elif which == "best":
        step = manager.best_step()
    elif which.isdigit() and int(which) in steps:
        step = int(which)
    else:
        raise UserError(
            f"`--checkpoint` must be auto, last, best or one of the steps {steps}, but is '{which}' instead."
        )
    if step is None:
        raise UserError(f"{output_dir} holds no {'scored ' if which == 'best' else ''}checkpoint to load.")
    return step


@dataclass
class BuiltParts:
    """The recipe's parts, split over the TP gang, with the model's sparse tables found and its sharded state."""

    parts: RecipeParts
    tables: dict[str, ShardedEmbeddingCollection]
    sharded_state: dict[str, ShardedStateful] = field(default_factory=dict)
    batch_size: ConfiguredBatchSize | None = None
    """The config's train batch size, where a field is typed ``GlobalBatchSize``: the first step checks it."""


def build_parts(job: ResolvedJob, gangs: Gangs, output_dir: str, scratch_stores: str | None = None) -> BuiltParts:
    """What the recipe builds, checked: its units set up, every sparse table found, checkpointed, and fed only
    features it looks up; the train batch size (``GlobalBatchSize``) a multiple of the DP ranks. Tables stored on
    disk keep their stores in the run's ``table_stores`` folder unless configured elsewhere; with
    ``scratch_stores`` (a job that only scores), all in there, away from a run that may be training."""
    config = job.config
    batch_size = configured_batch_size(config)
    if batch_size is not None:
        batch_size.per_rank(gangs.dp.size)  # Named by its key before a recipe's own check names another.
    seed_everything(config.seed)
    try:
        with AllocationGuard(gangs.root.device):
            parts: RecipeParts = job.recipe.build(RecipeContext(config, gangs, gangs.root.device, output_dir))
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as ex:
        raise _path_error(job.recipe.name, ex) from None
    check_units(parts)
    tensor_parallel(parts.train_unit.model, gangs)
    tables = find_sparse_tables(parts.train_unit.model)
    refuse_features_without_tables(tables)
    if scratch_stores is None:
        place_table_stores(tables, f"{output_dir}/{TABLE_STORES}")
    else:
        place_table_stores(tables, scratch_stores, replace=True)
    return BuiltParts(parts, tables, sharded_state_with_tables(tables, parts.sharded_state), batch_size)


def _path_error(recipe: str, ex: OSError) -> UserError:
    """A path the recipe could not open while building its parts, as a user error.

    While a recipe builds, a missing, unreadable or wrong-kind path is one the user configured
    (a data file, a vocabulary); later, the same errors are failures of the run. The traceback
    still goes to the rank's log, for the recipe's author.
    """
    log.info("Recipe '%s' failed on a path while building its parts.", recipe, exc_info=ex)
    detail = f"{ex.filename}: {ex.strerror}" if ex.filename is not None else f"{type(ex).__name__}: {ex}"
    return UserError(f"Recipe '{recipe}' could not build its parts: {detail.rstrip('.')}.")


@contextlib.contextmanager
def job_gangs(config: RecipeConfig, output_dir: str, lock: RunLock | None = None) -> Iterator[Gangs]:
    """The job's gangs, with per-rank logging set up, closed at the end.

    With ``lock``, rank 0 takes the output directory's lock for the whole job: right after the
    gangs, which tell every rank whether it could, and before logging, the first thing written
    to the directory.
    """
    device = default_device() if config.trainer.device == "auto" else torch.device(config.trainer.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("`trainer.device` is 'cuda', but this machine has no CUDA device.")
    # Before the gangs, the lock and the logs: a run refused for it must leave nothing written.
    check_at_most_the_cores(config.gang.threads_per_rank, "gang.threads_per_rank")
    try:
        gangs = setup_gangs(device, config.gang.tp_size, timedelta(seconds=config.gang.timeout_s))
    except ValueError as ex:
        raise ConfigError(str(ex)) from None
    try:
        if lock is not None:
            lock.acquire_on_rank_0(gangs.root)
        try:
            _setup_logging(output_dir, gangs.root.rank)
            if lock is not None:
                lock.log_take_over()
            gangs.root.barrier()  # The ranks measure the free cores together, each idle while the others do.
            threads = use_threads(config.gang.threads_per_rank)
            log.info("%s; numba pool of %d thread(s)", threads, numba.config.NUMBA_NUM_THREADS)
            if config.trainer.keep_freed_memory:
                log.info("%s", keep_freed_memory())
            if lock is not None and gangs.root.rank == 0:  # training says it at start-up
                print(threads)
            yield gangs
            gangs.root.barrier()  # On success, no rank tears down gloo while a peer still talks to it.
        finally:
            if lock is not None:
                lock.release()
    finally:
        gangs.close()


def _setup_logging(output_dir: str, rank: int) -> None:
    """Each rank logs to ``OUTPUT_DIR/logs/rank_K.log``; rank 0 also shows warnings on the console."""
    os.makedirs(f"{output_dir}/logs", exist_ok=True)
    handler = logging.FileHandler(f"{output_dir}/logs/rank_{rank}.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for old in [h for h in root.handlers if getattr(h, "_recipes_handler", False)]:
        root.removeHandler(old)
        old.close()
    handler._recipes_handler = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    if rank == 0:
        console = logging.StreamHandler(sys.stderr)
        console.setLevel(logging.WARNING)
        console.addFilter(lambda record: record.exc_info is None)  # Tracebacks go to the log file only.
        console._recipes_handler = True  # type: ignore[attr-defined]
        root.addHandler(console)


def write_text(path: str, text: str) -> None:
    """Write a small text file whole or not at all: to a temporary name, then renamed."""
    fs, fs_path = fsspec.core.url_to_fs(path)
    tmp = f"{fs_path}.tmp-{os.getpid()}"
    try:
        fs.makedirs(os.path.dirname(fs_path), exist_ok=True)
        with fs.open(tmp, "w") as f:
            f.write(text)
        fs.mv(tmp, fs_path)
    except OSError as ex:
        raise WriteError(path, ex) from ex
