"""From a preset and overrides to a running job: resolve the config, set up, build, train or evaluate."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import fsspec
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
)
from recipes.config import ConfigError, dump_yaml, load_yaml, overrides_to_dict, resolve_config, to_dict
from recipes.early_stopping import NOOP_EARLY_STOPPER, EarlyStopper, PatienceEarlyStopper
from recipes.errors import UserError
from recipes.parallel import data_parallel
from recipes.parts import RecipeContext, RecipeParts, build_lr_scheduler, build_optimizer
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
from recipes.registry import Preset, Recipe, find_preset, resolve_preset
from recipes.rng import seed_everything
from recipes.sections import RecipeConfig
from recipes.sparse_tables import (
    build_optimizer_with_tables,
    find_sparse_tables,
    refuse_features_without_tables,
    report_sparse_tables,
    sharded_state_with_tables,
)
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


def resolve_job(spec: JobSpec) -> ResolvedJob:
    """The preset's recipe and the config from defaults < preset < files < overrides."""
    preset = find_preset(spec.preset)
    recipe, layers = resolve_preset(preset)
    for path in spec.config_files:
        layers.append((f"--config-file {path}", read_config_file(path, recipe.name)))
    if spec.overrides:
        layers.append(("the command line", overrides_to_dict(list(spec.overrides))))
    return ResolvedJob(preset, recipe, resolve_config(recipe.config_class, layers))


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
    """The resolved config as a preset-shaped document: ``train`` and ``--config-file`` both take it back."""
    document: dict[str, Any] = {"recipe": job.recipe.name}
    if job.preset.description:
        document["description"] = job.preset.description
    if job.preset.imports:
        document["imports"] = list(job.preset.imports)
    document["config"] = to_dict(job.config)
    return document


def default_output_dir(spec: JobSpec) -> str:
    return spec.output_dir or os.path.join("runs", Path(spec.preset).stem)


def train(spec: JobSpec) -> str:
    """Train the preset, resuming from the output directory's last checkpoint; returns the directory."""
    job = resolve_job(spec)
    output_dir = default_output_dir(spec)
    with _job_gangs(job.config, output_dir) as gangs:
        if gangs.root.rank == 0 and job.config.checkpoint.start_over:
            archive_checkpoints(output_dir)
        gangs.root.barrier()
        manager = checkpoint_manager(job.config, output_dir, gangs)
        loaded = find_resume_checkpoint(manager, job.config)  # Refuses a changed config before anything is written.
        if gangs.root.rank == 0:
            write_text(f"{output_dir}/config.yaml", dump_yaml(config_document(job)))
        resume_step = None if loaded is None else loaded.step
        if job.config.checkpoint.start_over:
            resume_step = 0  # Hide the earlier run's curves too.
        checkpointer = TrainerCheckpointer(manager, job.config.checkpoint, job.config)
        trainer, recorder, _ = build_trainer(job, gangs, output_dir, checkpointer, resume_step)
        try:
            if loaded is not None:
                resume(trainer, loaded, gangs)
            with _stop_on_signals(trainer):
                trainer.run()
        finally:
            checkpointer.close()
            recorder.close()
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
        step = _checkpoint_step(manager, checkpoint, output_dir)
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
    """The checkpoints of a run, judged by the keep policy of the run's own ``config.yaml``."""
    config_path = f"{output_dir}/config.yaml"
    if not os.path.isfile(config_path):
        raise UserError(f"{output_dir} is not a run's output directory: it has no config.yaml.")
    config = resolve_job(JobSpec(config_path)).config
    # Read-only: listing a running job's directory must not delete its save in progress.
    manager = CheckpointManager(f"{output_dir}/checkpoints", FakeGang(), checkpoint_policy(config), clean_up=False)
    return sorted(manager.list_checkpoints(), key=lambda info: info.step)


def _checkpoint_step(manager: CheckpointManager, which: str, output_dir: str) -> int:
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
        raise UserError(f"{output_dir} holds no {'scored ' if which == 'best' else ''}checkpoint to evaluate.")
    return step


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
    parts: RecipeParts = job.recipe.build(RecipeContext(config, gangs, device, output_dir))
    tables = find_sparse_tables(parts.train_unit.model)
    refuse_features_without_tables(tables)
    sharded_state = sharded_state_with_tables(tables, parts.sharded_state)
    if config.checkpoint.init_from is not None and resume_step is None and not eval_only:
        initialize_from(parts.train_unit.model, sharded_state, config.checkpoint)
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
def _job_gangs(config: RecipeConfig, output_dir: str) -> Iterator[Gangs]:
    """The job's gangs, with per-rank logging set up, closed at the end."""
    device = default_device() if config.trainer.device == "auto" else torch.device(config.trainer.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("`trainer.device` is 'cuda', but this machine has no CUDA device.")
    try:
        gangs = setup_gangs(device, config.gang.tp_size, timedelta(seconds=config.gang.timeout_s))
    except ValueError as ex:
        raise ConfigError(str(ex)) from None
    try:
        _setup_logging(output_dir, gangs.root.rank)
        yield gangs
        gangs.root.barrier()  # On success, no rank tears down gloo while a peer still talks to it.
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


class _stop_on_signals:
    """SIGUSR1 and SIGTERM ask the trainer to finish its step, checkpoint and exit cleanly."""

    SIGNALS = (signal.SIGUSR1, signal.SIGTERM)

    def __init__(self, trainer: Trainer[Any]) -> None:
        self._trainer = trainer
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> None:
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        log.warning("Received signal %d; stopping after this step.", signum)
        self._trainer.request_stop()

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def write_text(path: str, text: str) -> None:
    """Write a small text file whole or not at all: to a temporary name, then renamed."""
    fs, fs_path = fsspec.core.url_to_fs(path)
    fs.makedirs(os.path.dirname(fs_path), exist_ok=True)
    tmp = f"{fs_path}.tmp-{os.getpid()}"
    with fs.open(tmp, "w") as f:
        f.write(text)
    fs.mv(tmp, fs_path)
