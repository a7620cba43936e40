"""``eval`` and ``predict``: the model of a checkpoint scored on a split, and what it predicts for every row.

Nothing of training is built: no optimizer, no data parallelism, no train pipeline. The recipe's
parts are built as for training (the same readers and units), the checkpoint's model and sparse
tables are loaded, and the split's reader goes through ``evaluation.evaluate``, the pass that
validation during training takes, so the metrics agree to the last bit on the same model and rows.
``importance`` starts from the same loaded checkpoint (``loaded_checkpoint``).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

from checkpoint import CheckpointManager
from gang import Gangs
from recipes.checkpointing.left_out import load_model_of
from recipes.checkpointing.run_checkpoints import checkpoint_manager, rank_states_to_load
from recipes.cli.job import BuiltParts, build_parts, checkpoint_step, job_gangs, resolve_job, run_config
from recipes.cli.job_spec import JobSpec, default_output_dir
from recipes.config.sections import RecipeConfig
from recipes.errors import UserError
from recipes.recorders import CompositeRecorder, MetricRecorder, RecorderContext, build_recorder
from recipes.training.evaluation import evaluate
from recipes.training.parts import RecipeParts
from recipes.training.precision import Autocast, autocast_for
from recipes.training.predictions import (
    PredictionCollector,
    check_writable,
    refuse_overwriting_inputs,
    write_predictions,
)
from recipes.training.protocols import Validation


@dataclass
class LoadedCheckpoint:
    """A checkpoint's model, in eval mode, with what scores the asked split: what ``eval``, ``predict`` and
    ``importance`` share."""

    config: RecipeConfig
    output_dir: str
    gangs: Gangs
    built: BuiltParts
    step: int
    validations: dict[str, Validation[Any]]
    """What scores the split, by the name its metrics are recorded under (see ``_split_validations``)."""
    autocast: Autocast


@contextlib.contextmanager
def loaded_checkpoint(spec: JobSpec, checkpoint: str, split: str, one_unit: bool) -> Iterator[LoadedCheckpoint]:
    """The job's gangs and parts with the model of a checkpoint of the output directory (``last``, ``best`` or a
    step) loaded; ``one_unit``: only the first eval unit scores ``valid``.

    The checkpoint and the split are checked before the state is read, so a misnamed one costs no load. The
    checkpoint is held while it is read, so that the run, if it is training, cannot prune it meanwhile; one
    pruned before it was held is chosen again (``last``: the newer one).
    """
    job = resolve_job(spec)
    output_dir = default_output_dir(spec)
    # The run's own config ranks its checkpoints: a preset's may leave the score's direction unset (once,
    # `eval PRESET OUTPUT_DIR --checkpoint best` of a run scored by a loss loaded the checkpoint of the highest loss).
    ranking = run_config(output_dir)
    with contextlib.ExitStack() as stack:
        gangs = stack.enter_context(job_gangs(job.config, output_dir))
        manager = checkpoint_manager(ranking, output_dir, gangs, clean_up=False)
        choose = partial(checkpoint_step, manager, checkpoint, output_dir)
        choose()
        scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="table-stores-"))
        built = build_parts(job, gangs, output_dir, scratch_stores=scratch)
        validations = _split_validations(built.parts, split, one_unit)
        step = manager.read(choose, partial(_load_model, manager, built, gangs))
        built.parts.train_unit.model.eval()
        autocast = autocast_for(job.config.trainer.mixed_precision, gangs.root.device)
        yield LoadedCheckpoint(job.config, output_dir, gangs, built, step, validations, autocast)


def _load_model(manager: CheckpointManager, built: BuiltParts, gangs: Gangs, step: int) -> int:
    """Load the model and tables of the checkpoint of ``step`` into ``built``; the step."""
    loaded = manager.load(step, keys=["model"])
    pieces = rank_states_to_load(loaded, gangs)[1]  # What the checkpoint left out is filled as a resume does.
    load_model_of(loaded, built.parts.train_unit.model, built.sharded_state, pieces)
    return step


def score(
    spec: JobSpec, checkpoint: str, split: str = "valid", predictions_path: str | None = None
) -> dict[str, dict[str, float]]:
    """Score the model of a checkpoint of the output directory (``last``, ``best`` or a step) on ``split``;
    the metrics by eval unit name (for ``valid``) or by the split's name.

    With ``predictions_path``, also write what the model predicts for every row of the split,
    in input order, as CSV or Parquet.
    """
    if predictions_path is not None:
        check_writable(predictions_path, default_output_dir(spec))
    with loaded_checkpoint(spec, checkpoint, split, one_unit=predictions_path is not None) as loaded:
        if predictions_path is not None:
            refuse_overwriting_inputs(predictions_path, loaded.config)
        recorder = _recorder(loaded.config, loaded.output_dir, loaded.gangs)
        try:
            collector = None if predictions_path is None else PredictionCollector()
            results = _score(loaded, recorder, collector)
            if collector is not None:
                columns = collector.gather(loaded.gangs.dp)
                if columns is not None and loaded.gangs.root.rank == 0:
                    write_predictions(predictions_path, columns)  # type: ignore[arg-type]
            return results
        finally:
            recorder.close()


def _score(
    loaded: LoadedCheckpoint, recorder: MetricRecorder, predictions: PredictionCollector | None
) -> dict[str, dict[str, float]]:
    """Every validation's metrics, recorded under ``eval_<name>`` at the checkpoint's step."""
    results = {}
    for name, validation in loaded.validations.items():
        results[name] = evaluate(validation, loaded.autocast, predictions)
        if loaded.gangs.root.rank == 0:
            recorder.record(f"eval_{name}", loaded.step, results[name])
    return results


def _split_validations(parts: RecipeParts, split: str, one_unit: bool) -> dict[str, Validation[Any]]:
    """What scores ``split``, by the name its metrics are recorded under: the recipe's validations (by unit) for
    ``valid``, else its first eval unit over the split's reader (by the split); ``one_unit``: the first only."""
    if not parts.validations:
        raise UserError("The recipe has no eval unit (`RecipeParts.validations` is empty), so nothing can score.")
    if split == "valid" and "valid" not in parts.splits:
        validations = parts.validations[:1] if one_unit else parts.validations
        return {validation.unit.name: validation for validation in validations}
    if split not in parts.splits:
        known = sorted({"valid", *parts.splits})
        raise UserError(f"`--split` must be a split the recipe has data for ({', '.join(known)}), but is '{split}'.")
    return {split: Validation(parts.validations[0].unit, parts.splits[split])}


def _recorder(config: RecipeConfig, output_dir: str, gangs: Gangs) -> MetricRecorder:
    if gangs.root.rank != 0:
        return CompositeRecorder([])
    return build_recorder(config.metrics.recorders, RecorderContext(output_dir, None, None, training=False))
