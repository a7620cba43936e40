"""``importance``: which features a checkpoint's model relies on, by permutation importance.

Each feature in turn is moved to other rows by a permutation of all the split's rows (``permutation``),
and the split is scored again with the eval unit, as ``eval`` scores it: the more the AUC drops and
the NE rises, the more the model needed the feature. The permutations come from ``--seed`` alone, so
a rerun prints the same table. The split is held in memory, in one process: a permutation spans every
row, which data-parallel ranks would each hold a share of.
"""

from __future__ import annotations

import glob
import logging
import os
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from recipes.cli.job_spec import JobSpec, default_output_dir
from recipes.cli.permutation import HeldReader, Steps, feature_names, hold_split, num_rows, permuted
from recipes.cli.scoring import LoadedCheckpoint, loaded_checkpoint
from recipes.errors import UserError, WriteError
from recipes.training.evaluation import evaluate
from recipes.training.precision import Autocast
from recipes.training.predictions import check_writable, refuse_overwriting_inputs, write_predictions
from recipes.training.protocols import Validation
from units import EvalUnit

log = logging.getLogger(__name__)

METRICS = ("auc", "ne")
"""What the eval unit must report: a feature is ranked by how much AUC drops, then how much NE rises."""


@dataclass(frozen=True)
class FeatureImportance:
    """One feature's row of the table: the drop and rise from the baseline, and the metrics once permuted."""

    feature: str
    auc_drop: float
    ne_rise: float
    auc: float
    ne: float


@dataclass(frozen=True)
class ImportanceReport:
    """The table of a run's ``importance``: the baseline and every feature, most important first."""

    seed: int
    num_rows: int
    auc: float
    ne: float
    features: list[FeatureImportance]
    split: str = ""
    step: int = 0


def importance(
    spec: JobSpec, checkpoint: str = "last", split: str = "valid", seed: int = 0, table_path: str | None = None
) -> ImportanceReport:
    """Permutation importance of every feature of ``split`` for the checkpoint's model; the table also goes to
    ``table_path`` (CSV or Parquet), and as a chart to TensorBoard under ``OUTPUT_DIR/tb/importance_<split>``."""
    if seed < 0:
        raise UserError(f"`--seed` must be a non-negative integer, but is {seed} instead.")
    if table_path is not None:
        check_writable(table_path, default_output_dir(spec))
    with loaded_checkpoint(spec, checkpoint, split, one_unit=True) as loaded:
        if table_path is not None:
            refuse_overwriting_inputs(table_path, loaded.config)
        if loaded.gangs.root.size > 1:
            raise UserError(
                "`importance` permutes each feature across all the split's rows, which one process holds, so it "
                f"must run in one process, but runs in {loaded.gangs.root.size}."
            )
        [validation] = loaded.validations.values()
        report = _report(loaded, validation, split, seed)
        if table_path is not None:
            write_predictions(table_path, table_columns(report))
        tensorboard = loaded.config.metrics.recorders.get("tensorboard")
        if tensorboard is not None and tensorboard.enabled:
            record_chart(f"{loaded.output_dir}/tb/importance_{split}", report)
        return report


def _report(loaded: LoadedCheckpoint, validation: Validation[Any], split: str, seed: int) -> ImportanceReport:
    unit = validation.unit
    missing = [name for name in METRICS if name not in unit.metric_bag]
    if missing:
        raise UserError(
            f"`importance` ranks features by the drop of AUC and the rise of NE, so the eval unit '{unit.name}' must "
            f"report the metrics {list(METRICS)}, but reports {list(unit.metric_bag)} instead."
        )
    steps = hold_split(validation.reader, split)
    return replace(permutation_importance(unit, steps, loaded.autocast, seed), split=split, step=loaded.step)


def permutation_importance(unit: EvalUnit[Any], steps: Steps, autocast: Autocast, seed: int) -> ImportanceReport:
    """Score the held ``steps`` as they are, then with each feature permuted in turn (the ``k``-th feature by the
    ``k``-th permutation drawn from ``seed``); the features sorted by AUC drop, then NE rise, then name."""
    names = feature_names(steps)
    baseline = _scores(unit, steps, autocast)
    generator = torch.Generator().manual_seed(seed)
    features = []
    for i, name in enumerate(names):
        scores = _scores(unit, permuted(steps, name, generator), autocast)
        features.append(FeatureImportance(name, baseline[0] - scores[0], scores[1] - baseline[1], *scores))
        log.info("importance %d/%d: %s auc=%.6g ne=%.6g", i + 1, len(names), name, *scores)
    features.sort(key=lambda row: (-row.auc_drop, -row.ne_rise, row.feature))
    rows = sum(num_rows(batch) for batches in steps for batch in batches)
    return ImportanceReport(seed, rows, *baseline, features)


def _scores(unit: EvalUnit[Any], steps: Steps, autocast: Autocast) -> tuple[float, float]:
    values = evaluate(Validation(unit, HeldReader(steps)), autocast)
    return values["auc"], values["ne"]


def format_table(report: ImportanceReport) -> str:
    """The table as the CLI prints it: a heading, the baseline, then a line per feature, most important first."""
    width = max([len("feature"), *(len(row.feature) for row in report.features)])
    lines = [
        f"Permutation importance on the {report.split} split ({report.num_rows:,} rows), checkpoint step "
        f"{report.step}, seed {report.seed}",
        f"baseline: auc={report.auc:.6f} ne={report.ne:.6f}",
        f"{'rank':>4}  {'feature':<{width}}  {'auc_drop':>9}  {'ne_rise':>9}",
    ]
    for rank, row in enumerate(report.features, 1):
        lines.append(f"{rank:>4}  {row.feature:<{width}}  {row.auc_drop:>9.6f}  {row.ne_rise:>9.6f}")
    return "\n".join(lines)


def table_columns(report: ImportanceReport) -> dict[str, np.ndarray]:
    """The table as columns, most important first; the baseline is ``auc + auc_drop`` and ``ne - ne_rise``."""
    rows = report.features
    return {
        "rank": np.arange(1, len(rows) + 1),
        "feature": np.array([row.feature for row in rows], dtype=object),
        "auc_drop": np.array([row.auc_drop for row in rows]),
        "ne_rise": np.array([row.ne_rise for row in rows]),
        "auc": np.array([row.auc for row in rows]),
        "ne": np.array([row.ne for row in rows]),
    }


def record_chart(log_dir: str, report: ImportanceReport) -> None:
    """TensorBoard's view of the table: ``importance/auc_drop`` and ``importance/ne_rise`` at steps 1, 2... in rank
    order (a descending bar-like curve), and the table as text, whose rows name the features of those steps.

    The folder holds only the latest run's chart: the earlier runs' event files are removed first. Purging by step
    was not enough: TensorBoard reads a folder's files in name order, and two files written in the same second
    order by a counter compared as text (``.10`` before ``.9``), so the older chart could come last and win.
    """
    from torch.utils.tensorboard import SummaryWriter  # Slow to import.

    try:
        for earlier in glob.glob(os.path.join(glob.escape(log_dir), "events.out.tfevents.*")):
            os.remove(earlier)
        writer = SummaryWriter(log_dir)
        try:
            for rank, row in enumerate(report.features, 1):
                writer.add_scalar("importance/auc_drop", row.auc_drop, rank)
                writer.add_scalar("importance/ne_rise", row.ne_rise, rank)
            writer.add_text("importance/table", _markdown(report), 0)
            writer.flush()
        finally:
            writer.close()
    except OSError as ex:
        raise WriteError(log_dir, ex) from ex


def _markdown(report: ImportanceReport) -> str:
    lines = [
        f"Split {report.split} ({report.num_rows:,} rows), checkpoint step {report.step}, seed {report.seed}; "
        f"baseline auc={report.auc:.6f} ne={report.ne:.6f}",
        "",
        "| rank | feature | auc_drop | ne_rise |",
        "| ---: | --- | ---: | ---: |",
    ]
    for rank, row in enumerate(report.features, 1):
        lines.append(f"| {rank} | {row.feature} | {row.auc_drop:.6f} | {row.ne_rise:.6f} |")
    return "\n".join(lines)
