"""From a preset and overrides to a running job: resolve the config, set up, build, train or evaluate."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import fsspec
import numba
import torch
import yaml

from checkpoint import CheckpointInfo, CheckpointManager
from gang import FakeGang, Gangs, default_device, setup_gangs
from recipes.checkpointing import (
    TrainerCheckpointer,
    archive_checkpoints,
    checkpoint_manager,
    checkpoint_policy,
    find_resume_checkpoint,
    initialize_from,
    rank_states_to_load,
    resume,
    set_earlier_metrics_aside,
)
from recipes.config import ConfigError, dump_yaml, load_yaml, overrides_to_dict, resolve_config, to_dict
from recipes.early_stopping import NOOP_EARLY_STOPPER, EarlyStopper, PatienceEarlyStopper
from recipes.errors import UserError
from recipes.host_memory import keep_freed_memory
from recipes.parallel import data_parallel
from recipes.parts import RecipeContext, RecipeParts, build_lr_scheduler, build_optimizer
from recipes.pipeline import PipelinedReader
from recipes.predictions import PredictionCollector, check_writable, write_predictions
from recipes.profiler import Profiler
from recipes.protocols import NOOP_CHECKPOINTER, Checkpointer, Validation
from recipes.recorders import (
    CompositeRecorder,
    ConsoleRecorder,
    JsonlRecorder,
    MetricRecorder,
    TensorBoardRecorder,
    WandbRecorder,
)
from recipes.registry import Preset, Recipe, find_preset, recorded_imports, resolve_preset
from recipes.rng import seed_everything
from recipes.run_lock import RunLock
from recipes.sections import RecipeConfig
from recipes.sparse_tables import (
    build_optimizer_with_tables,
    find_sparse_tables,
    hash_table_metrics,
    refuse_features_without_tables,
    report_sparse_tables,
    sharded_state_with_tables,
)
from recipes.stop_signals import StopOnSignals, TrainingInterrupted
from recipes.threads import use_threads
from recipes.trainer import Trainer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobSpec:
    """What the user asked for on the command line."""

    preset: str
    output_dir: str | None = None
    config_files: Sequence[str] = ()
    overrides: Sequence[str] = ()


@dataclass(frozen=True)
class ResolvedJob:
    preset: Preset
    recipe: Recipe
    config: RecipeConfig
    imports: tuple[str, ...] = ()
    """The modules the preset's whole ``based_on`` chain imports, which a re-run imports again."""
    search_path: tuple[str, ...] = ()
    """The absolute folders those imports came from."""


def resolve_job(spec: JobSpec) -> ResolvedJob:
    """The preset's recipe and the config from defaults < preset < files < overrides."""
    preset = find_preset(spec.preset)
    recipe, layers = resolve_preset(preset)
    imports, search_path = recorded_imports(preset)
    for path in spec.config_files:
        layers.append((f"--config-file {path}", read_config_file(path, recipe.name)))
    if spec.overrides:
        layers.append(("the command line", overrides_to_dict(list(spec.overrides))))
    return ResolvedJob(preset, recipe, resolve_config(recipe.config_class, layers), imports, search_path)


def read_config_file(path: str, recipe_name: str) -> Mapping[str, Any]:
    """A config file: plain sections, or a preset-shaped file (a run's ``config.yaml``) of the same recipe."""
    if not os.path.isfile(path):
        raise UserError(f"The config file {path} does not exist.")
    try:
        with open(path) as f:
            data = load_yaml(f) or {}
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


def default_output_dir(spec: JobSpec) -> str:
    return spec.output_dir or os.path.join("runs", Path(spec.preset).stem)


def train(spec: JobSpec) -> str:
    """Train the preset, resuming from the output directory's last checkpoint; returns the directory.

    The run holds the output directory's lock throughout (see ``run_lock``). Raises
    ``TrainingInterrupted`` once the checkpoint is committed when SIGINT stopped it.
    """
    job = resolve_job(spec)
    output_dir = default_output_dir(spec)
    lock = RunLock(output_dir)
    signals = StopOnSignals(before_exit_now=lock.release)
    with _job_gangs(job.config, output_dir, lock) as gangs:
        if gangs.root.rank == 0 and job.config.checkpoint.start_over:
            archive_checkpoints(output_dir)
        gangs.root.barrier()
        manager = checkpoint_manager(job.config, output_dir, gangs)
        loaded = find_resume_checkpoint(manager, job.config)  # Refuses a changed config before anything is written.
        set_earlier_metrics_aside(output_dir, loaded, gangs)
        if gangs.root.rank == 0:
            write_text(f"{output_dir}/config.yaml", dump_yaml(config_document(job)))
        resume_step = None if loaded is None else loaded.step
        if job.config.checkpoint.start_over:
            resume_step = 0  # Hide the earlier run's curves too.
        checkpointer = TrainerCheckpointer(manager, job.config.checkpoint, job.config)
        trainer, recorder, parts = build_trainer(job, gangs, output_dir, checkpointer, resume_step)
        try:
            if loaded is not None:
                resume(trainer, loaded, gangs)
            with signals.stopping(trainer):
                trainer.run()
        except BaseException:
            parts.train_reader.close(wait=False)
            raise
        else:
            parts.train_reader.close()
        finally:
            checkpointer.close()
            recorder.close()
    if signals.interrupted:
        raise TrainingInterrupted(
            f"interrupted at step {trainer.step_nr}, after saving its checkpoint; the same command resumes there."
        )
    return output_dir


def evaluate(
    spec: JobSpec, checkpoint: str, split: str = "valid", predictions_path: str | None = None
) -> dict[str, dict[str, float]]:
    """Score the model of a checkpoint of the output directory (``last``, ``best`` or a step) on ``split``.

    With ``predictions_path``, also write what the model predicts for every row of the split,
    in input order, as CSV or Parquet.
    """
    job = resolve_job(spec)
    output_dir = default_output_dir(spec)
    if predictions_path is not None:
        check_writable(predictions_path)
    with _job_gangs(job.config, output_dir) as gangs:
        manager = checkpoint_manager(job.config, output_dir, gangs, clean_up=False)
        step = checkpoint_step(manager, checkpoint, output_dir)
        trainer, recorder, parts = build_trainer(
            job, gangs, output_dir, checkpointer=NOOP_CHECKPOINTER, resume_step=None, eval_only=True
        )
        try:
            validations = _split_validations(parts, split, predictions_path is not None)
            loaded = manager.load(step, keys=["model"])
            trainer.load_model_state(loaded.shared_state["model"])
            trainer.load_sharded_state(rank_states_to_load(loaded, gangs)[1])
            collector = None if predictions_path is None else PredictionCollector()
            results = trainer.validate_only(step, validations, collector)
            if collector is not None:
                columns = collector.gather(gangs.dp)
                if columns is not None and gangs.root.rank == 0:
                    write_predictions(predictions_path, columns)  # type: ignore[arg-type]
            return results
        finally:
            recorder.close()


def _split_validations(parts: RecipeParts, split: str, predicting: bool) -> list[Validation[Any]] | None:
    """What scores ``split``: the recipe's validations for ``valid`` (``None``), else its first eval unit
    over the split's reader; to predict, one unit only."""
    if not parts.validations:
        raise UserError("The recipe has no eval unit (`RecipeParts.validations` is empty), so nothing can score.")
    if split == "valid" and "valid" not in parts.splits:
        return parts.validations[:1] if predicting else None
    if split not in parts.splits:
        known = sorted({"valid", *parts.splits})
        raise UserError(f"`--split` must be a split the recipe has data for ({', '.join(known)}), but is '{split}'.")
    return [Validation(parts.validations[0].unit, parts.splits[split])]


def list_checkpoints(output_dir: str) -> list[CheckpointInfo]:
    """The checkpoints of a run, judged by the keep policy of the run's own ``config.yaml``, and the damaged
    ones (``damage`` set), which a user must be able to find since they are never deleted."""
    config_path = f"{output_dir}/config.yaml"
    if not os.path.isfile(config_path):
        raise UserError(f"{output_dir} is not a run's output directory: it has no config.yaml.")
    config = resolve_job(JobSpec(config_path)).config
    # Read-only: listing a running job's directory must not delete its save in progress.
    manager = CheckpointManager(f"{output_dir}/checkpoints", FakeGang(), checkpoint_policy(config), clean_up=False)
    infos = manager.list_checkpoints() + manager.list_damaged()
    return sorted(infos, key=lambda info: (info.step, info.damage is not None, info.path))


def checkpoint_step(manager: CheckpointManager, which: str, output_dir: str) -> int:
    """The step of ``--checkpoint WHICH`` (last, best or a step) among the run's committed checkpoints."""
    steps = [info.step for info in manager.list_checkpoints()]
    if which == "last":
        step = max(steps, default=None)
    elif which == "best":
        step = manager.best_step()
    elif which.isdigit() and int(which) in steps:
        step = int(which)
    else:
        raise UserError(f"`--checkpoint` must be last, best or one of the steps {steps}, but is '{which}' instead.")
    if step is None:
        raise UserError(f"{output_dir} holds no {'scored ' if which == 'best' else ''}checkpoint to load.")
    return step


def _path_error(recipe: str, ex: OSError) -> UserError:
    """A path the recipe could not open while building its parts, as a user error.

    While a recipe builds, a missing, unreadable or wrong-kind path is one the user configured
    (a data file, a vocabulary); later, the same errors are failures of the run. The traceback
    still goes to the rank's log, for the recipe's author.
    """
    log.info("Recipe '%s' failed on a path while building its parts.", recipe, exc_info=ex)
    detail = f"{ex.filename}: {ex.strerror}" if ex.filename is not None else f"{type(ex).__name__}: {ex}"
    return UserError(f"Recipe '{recipe}' could not build its parts: {detail.rstrip('.')}.")


def build_trainer(
    job: ResolvedJob,
    gangs: Gangs,
    output_dir: str,
    checkpointer: Checkpointer,
    resume_step: int | None,
    eval_only: bool = False,
) -> tuple[Trainer[Any], MetricRecorder, RecipeParts]:
    """The recipe's parts plus the standard ones, assembled into a Trainer."""
    config = job.config
    seed_everything(config.seed)
    device = gangs.root.device
    try:
        parts: RecipeParts = job.recipe.build(RecipeContext(config, gangs, device, output_dir))
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as ex:
        raise _path_error(job.recipe.name, ex) from None
    tables = find_sparse_tables(parts.train_unit.model)
    refuse_features_without_tables(tables)
    sharded_state = sharded_state_with_tables(tables, parts.sharded_state)
    if config.checkpoint.init_from is not None and resume_step is None and not eval_only:
        initialize_from(parts.train_unit.model, sharded_state, config.checkpoint)
    if config.trainer.pipeline and not eval_only:
        parts.train_reader = PipelinedReader(parts.train_reader, list(tables.values()), device, gangs)
    model = data_parallel(parts.train_unit.model, gangs)
    parts.train_unit.model = model
    optimizer = build_optimizer_with_tables(
        model, tables, lambda wrapped: build_optimizer(config.optimizer, wrapped.parameters()), parts.make_optimizer
    )
    report = report_sparse_tables(tables)
    if gangs.root.rank == 0 and not eval_only:
        for line in report:
            print(line)
    try:
        lr_scheduler = build_lr_scheduler(config.lr_scheduler, optimizer, config.trainer.max_num_steps)
    except ValueError as ex:
        raise ConfigError(str(ex)) from None
    recorder = build_recorder(config, output_dir, gangs.root.rank, resume_step, console=not eval_only)
    stopping = config.trainer.early_stopping
    early_stopper: EarlyStopper = NOOP_EARLY_STOPPER
    if stopping.patience is not None:
        if config.trainer.score_metric is None:
            raise ConfigError("`trainer.early_stopping.patience` needs `trainer.score_metric` to be set.")
        early_stopper = PatienceEarlyStopper(stopping.patience, stopping.min_delta, config.trainer.lower_better)
    profiler = Profiler(
        config.profiler.enabled and not eval_only,
        config.profiler.skip_steps,
        config.profiler.record_steps,
        f"{output_dir}/tb/profiler",
        gangs.root.rank,
    )
    try:
        trainer = Trainer(
            unit=parts.train_unit,
            data_reader=parts.train_reader,
            optimizer=optimizer,
            lr_scheduler=lr_scheduler,
            gangs=gangs,
            device=device,
            config=config.trainer,
            validations=parts.validations,
            recorder=recorder,
            profiler=profiler,
            early_stopper=early_stopper,
            sharded_state=sharded_state,
            checkpointer=checkpointer,
            checkpoint_every_n_steps=config.checkpoint.every_n_steps,
            checkpoint_every_n_data_epochs=config.checkpoint.every_n_data_epochs,
            state_metrics=lambda: hash_table_metrics(tables),
        )
    except BaseException:
        recorder.close()
        raise
    if gangs.root.rank == 0 and resume_step is None and not eval_only:
        recorder.record_config(to_dict(config))
    return trainer, recorder, parts


def build_recorder(
    config: RecipeConfig, output_dir: str, rank: int, resume_step: int | None, console: bool = True
) -> MetricRecorder:
    """Rank 0's recorders, as the ``metrics`` section asks; the other ranks record nothing."""
    if rank != 0:
        return CompositeRecorder([])
    section = config.metrics
    recorders: list[MetricRecorder] = []
    purge_step = None if resume_step is None else resume_step + 1
    if section.tensorboard:
        recorders.append(TensorBoardRecorder(f"{output_dir}/tb", purge_step=purge_step))
    if section.jsonl:
        recorders.append(JsonlRecorder(f"{output_dir}/metrics", resume_step=resume_step))
    wandb = section.wandb
    if wandb.enabled and wandb.mode != "disabled":
        recorders.append(WandbRecorder(output_dir, wandb.project, wandb.entity, wandb.run_name, wandb.mode))
    if section.console and console:
        recorders.append(ConsoleRecorder(config.trainer.max_num_steps, initial_step=resume_step or 0))
    return CompositeRecorder(recorders)


@contextlib.contextmanager
def _job_gangs(config: RecipeConfig, output_dir: str, lock: RunLock | None = None) -> Iterator[Gangs]:
    """The job's gangs, with per-rank logging set up, closed at the end.

    With ``lock``, rank 0 takes the output directory's lock for the whole job: right after the
    gangs, which tell every rank whether it could, and before logging, the first thing written
    to the directory.
    """
    device = default_device() if config.trainer.device == "auto" else torch.device(config.trainer.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("`trainer.device` is 'cuda', but this machine has no CUDA device.")
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
    fs.makedirs(os.path.dirname(fs_path), exist_ok=True)
    tmp = f"{fs_path}.tmp-{os.getpid()}"
    with fs.open(tmp, "w") as f:
        f.write(text)
    fs.mv(tmp, fs_path)
