"""``train``: from a resolved job to a running Trainer, resumed from the output directory's last checkpoint."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from gang import Gangs
from recipes.checkpointing.left_out import refuse_unmatched_exclude
from recipes.checkpointing.run_checkpoints import (
    TrainerCheckpointer,
    archive_checkpoints,
    build_model_bank,
    checkpoint_manager,
    find_resume_checkpoint,
    resume,
    set_earlier_metrics_aside,
)
from recipes.cli.job import (
    BuiltParts,
    ResolvedJob,
    build_parts,
    config_document,
    job_gangs,
    resolve_job,
    write_text,
)
from recipes.cli.job_spec import JobSpec, default_output_dir
from recipes.config.resolution import ConfigError, dump_yaml, to_dict
from recipes.config.sections import RecipeConfig
from recipes.lr_schedules import build_lr_scheduler
from recipes.optimizers import build_optimizer
from recipes.recorders import CompositeRecorder, MetricRecorder, RecorderContext, build_recorder
from recipes.runtime.run_lock import RunLock
from recipes.training.checkpoint_schedule import CheckpointSchedule
from recipes.training.early_stopping import (
    NOOP_EARLY_STOPPER,
    EarlyStopper,
    PatienceEarlyStopper,
    ScoreWatch,
    WatchedEarlyStopper,
)
from recipes.training.parallel import data_parallel
from recipes.training.pipeline import PipelinedReader, use_pipeline
from recipes.training.precision import autocast_for
from recipes.training.profiler import Profiler
from recipes.training.protocols import Checkpointer
from recipes.training.score import ScoreMetric, resolve_score
from recipes.training.sparse_tables import build_optimizer_with_tables, hash_table_metrics, report_sparse_tables
from recipes.training.stop_signals import StopOnSignals, TrainingInterrupted
from recipes.training.trainer import Trainer
from recipes.training.validator import Validator, make_validator, refuse_ignored_metric_columns

log = logging.getLogger(__name__)


def train(spec: JobSpec, watch: ScoreWatch | None = None) -> str:
    """Train the preset, resuming from the output directory's last checkpoint; returns the directory. ``watch``, told
    every validation score, may stop the run as early stopping does (a sweep prunes its trials so).

    The run holds the output directory's lock throughout (see ``run_lock``). Raises
    ``TrainingInterrupted`` once the checkpoint is committed when SIGINT stopped it.
    """
    job = resolve_job(spec)
    output_dir = default_output_dir(spec)
    lock = RunLock(output_dir)
    signals = StopOnSignals(before_exit_now=lock.release)
    with job_gangs(job.config, output_dir, lock) as gangs:
        if gangs.root.rank == 0 and job.config.checkpoint.start_over:
            archive_checkpoints(output_dir)
        gangs.root.barrier()
        # The newest checkpoint, whichever way scores rank (known once the recipe's metrics are built).
        # Refuses a changed config before anything is written.
        loaded = find_resume_checkpoint(checkpoint_manager(job.config, output_dir, gangs), job.config)
        set_earlier_metrics_aside(output_dir, loaded, gangs)
        resume_step = None if loaded is None else loaded.step
        if job.config.checkpoint.start_over:
            resume_step = 0  # Hide the earlier run's curves too.
        built = build_parts(job, gangs, output_dir)
        job = with_score_direction(job, built)
        if gangs.root.rank == 0:  # With the direction, for whoever ranks this run's checkpoints later.
            write_text(f"{output_dir}/config.yaml", dump_yaml(config_document(job)))
        manager = checkpoint_manager(job.config, output_dir, gangs)
        checkpointer = TrainerCheckpointer(manager, job.config.checkpoint, job.config)
        trainer, recorder = assemble_trainer(job, built, gangs, output_dir, checkpointer, resume_step, watch)
        checkpointer.use_save_filter(built.parts.save_filter)
        train_reader = built.parts.train_reader
        try:
            if loaded is not None:
                resume(trainer, loaded, gangs)
            with signals.stopping(trainer):
                trainer.run()
        except BaseException:
            train_reader.close(wait=False)
            raise
        else:
            train_reader.close()
        finally:
            checkpointer.close()
            recorder.close()
    if signals.interrupted:
        raise TrainingInterrupted(
            f"interrupted at step {trainer.step_nr}, after saving its checkpoint; the same command resumes there."
        )
    return output_dir


def build_trainer(
    job: ResolvedJob, gangs: Gangs, output_dir: str, checkpointer: Checkpointer, resume_step: int | None
) -> tuple[Trainer[Any], MetricRecorder, BuiltParts]:
    """The recipe's parts plus the standard ones, assembled into a Trainer."""
    built = build_parts(job, gangs, output_dir)
    trainer, recorder = assemble_trainer(
        with_score_direction(job, built), built, gangs, output_dir, checkpointer, resume_step
    )
    return trainer, recorder, built


def with_score_direction(job: ResolvedJob, built: BuiltParts) -> ResolvedJob:
    """``job`` with ``trainer.lower_better`` as the score's metric says (``training.score``), checked against it."""
    trainer = job.config.trainer
    if trainer.score_metric is None:
        return job
    score = resolve_score(ScoreMetric(trainer.score_metric, trainer.lower_better), built.parts.validations)
    return replace(job, config=replace(job.config, trainer=replace(trainer, lower_better=score.lower_better)))


def assemble_trainer(
    job: ResolvedJob,
    built: BuiltParts,
    gangs: Gangs,
    output_dir: str,
    checkpointer: Checkpointer,
    resume_step: int | None,
    watch: ScoreWatch | None = None,
) -> tuple[Trainer[Any], MetricRecorder]:
    """The recipe's built parts plus the standard ones, assembled into a Trainer; ``job``'s score direction
    resolved; ``watch`` told every validation score beside the early stopper."""
    config = job.config
    device = gangs.root.device
    parts, tables = built.parts, built.tables
    refuse_unmatched_exclude(config.checkpoint.exclude, parts.train_unit.model, built.sharded_state)
    model_bank = build_model_bank(parts.train_unit.model, built.sharded_state, config.checkpoint, gangs)
    if resume_step is None:
        model_bank.load()
    reads_disk = any(table.storage.tier == "disk" for collection in tables.values() for table in collection.tables)
    if use_pipeline(config.trainer.pipeline, device, reads_disk):
        parts.train_reader = PipelinedReader(parts.train_reader, list(tables.values()), device, gangs)
    model = data_parallel(parts.train_unit.model, gangs)
    parts.train_unit.model = model
    optimizer = build_optimizer_with_tables(
        model, tables, lambda wrapped: build_optimizer(config.optimizer, wrapped.parameters()), parts.make_optimizer
    )
    report = report_sparse_tables(tables)
    if gangs.root.rank == 0:
        for line in report:
            print(line)
    lr_scheduler = build_lr_scheduler(config.lr_scheduler, optimizer, config.trainer.max_num_steps)
    recorder: MetricRecorder = CompositeRecorder([])  # Only rank 0 records.
    if gangs.root.rank == 0:
        context = RecorderContext(output_dir, resume_step, config.trainer.max_num_steps, training=True)
        recorder = build_recorder(config.metrics.recorders, context)
    profiler = Profiler(
        config.profiler.enabled,
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
            recorder=recorder,
            profiler=profiler,
            validator=build_validator(config, built, recorder, gangs, watch),
            sharded_state=built.sharded_state,
            checkpointer=checkpointer,
            checkpoints=CheckpointSchedule.of(config.checkpoint),
            state_metrics=lambda: hash_table_metrics(tables),
            reloads=model_bank if model_bank.reloads else None,
            batch_size=built.batch_size,
        )
    except BaseException:
        recorder.close()
        raise
    if gangs.root.rank == 0 and resume_step is None:
        recorder.record_config(to_dict(config))
    return trainer, recorder


def build_validator(
    config: RecipeConfig, built: BuiltParts, recorder: MetricRecorder, gangs: Gangs, watch: ScoreWatch | None = None
) -> Validator:
    """The recipe's validations, scored by ``trainer.score_metric`` and watched by early stopping if configured, and
    by ``watch`` if given (which needs the score)."""
    trainer, stopping = config.trainer, config.trainer.early_stopping
    model, validations = built.parts.train_unit.model, built.parts.validations
    early_stopper: EarlyStopper = NOOP_EARLY_STOPPER
    score = None if trainer.score_metric is None else ScoreMetric(trainer.score_metric, trainer.lower_better)
    if stopping.patience is not None:
        if score is None:
            raise ConfigError("`trainer.early_stopping.patience` needs `trainer.score_metric` to be set.")
        lower_better = resolve_score(score, validations).lower_better
        early_stopper = PatienceEarlyStopper(stopping.patience, stopping.min_delta, lower_better)
    if watch is not None:
        if score is None:
            raise ConfigError("`trainer.score_metric` must name the validation metric a sweep compares, but is unset.")
        early_stopper = WatchedEarlyStopper(early_stopper, watch, resolve_score(score, validations).lower_better)
    refuse_ignored_metric_columns(config.metrics, validations)
    autocast = autocast_for(trainer.mixed_precision, gangs.root.device)
    return make_validator(validations, model, recorder, gangs.root.rank, autocast, score, early_stopper)
