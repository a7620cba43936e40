"""What a sweep leaves beside its trials: the results table (console, CSV, Parquet), TensorBoard's HParams view of
the trials, and ``best.yaml``, the best trial's config as a preset that ``train`` runs again.

All are rewritten from the study after each trial ends, so that a sweep stopped at any point leaves them current.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from recipes.cli.job import write_text
from recipes.cli.sweep_study import KILLED, RUN_DIR, SCORE, THREADS_SET
from recipes.config.text import dump_yaml, read_yaml_file

_STATES = {TrialState.COMPLETE: "complete", TrialState.PRUNED: "pruned", TrialState.RUNNING: "running"}


def results_rows(trials: Sequence[FrozenTrial], keys: Sequence[str]) -> list[dict[str, Any]]:
    """One row per trial, in number order: its state, score and values, and its run directory."""
    rows = []
    for trial in sorted(trials, key=lambda t: t.number):
        if trial.state == TrialState.WAITING:
            continue
        state = _STATES.get(trial.state, "killed" if trial.user_attrs.get(KILLED) else "failed")
        row: dict[str, Any] = {"trial": trial.number, "state": state, "score": trial.user_attrs.get(SCORE)}
        row.update({key: trial.params.get(key) for key in keys})
        row["run_dir"] = trial.user_attrs.get(RUN_DIR)
        rows.append(row)
    return rows


def format_table(rows: Sequence[dict[str, Any]], score_name: str) -> str:
    """The rows as an aligned text table, the score headed by its metric."""
    if not rows:
        return "No trials yet."
    header = [score_name if name == "score" else name for name in rows[0]]
    cells = [[_cell(value) for value in row.values()] for row in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def write_tables(sweep_dir: str, rows: Sequence[dict[str, Any]]) -> None:
    """``results.csv`` and ``results.parquet`` in the sweep's directory, each written whole or not at all."""
    if not rows:
        return
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    write_text(os.path.join(sweep_dir, "results.csv"), text.getvalue())
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = os.path.join(sweep_dir, "results.parquet")
    columns = {name: [_arrow_value(row[name]) for row in rows] for name in rows[0]}
    pq.write_table(pa.table(columns), f"{path}.tmp")
    os.replace(f"{path}.tmp", path)


def _arrow_value(value: Any) -> Any:
    """A choice column may mix names and numbers: Arrow takes one type per column, so such values are text."""
    return value if value is None or isinstance(value, (int, float)) else str(value)


def write_hparams(sweep_dir: str, trial: FrozenTrial, score_name: str, space: dict[str, Any]) -> None:
    """The trial as one session of TensorBoard's HParams view (``DIR/hparams/trial_NNNN``): its values and score."""
    from torch.utils.tensorboard import SummaryWriter

    run = f"trial_{trial.number:04d}"
    if os.path.isdir(os.path.join(sweep_dir, "hparams", run)) or trial.user_attrs.get(SCORE) is None:
        return
    params = {key: _hparam(trial.params.get(key)) for key in space}
    discrete = {
        key: [_hparam(c) for c in dist.choices]
        for key, dist in space.items()
        if isinstance(dist, optuna.distributions.CategoricalDistribution)
    }
    with SummaryWriter(os.path.join(sweep_dir, "hparams")) as writer:
        writer.add_hparams(
            params, {score_name: float(trial.user_attrs[SCORE])}, hparam_domain_discrete=discrete, run_name=run
        )


def _hparam(value: Any) -> Any:
    return "null" if value is None else value if isinstance(value, (int, float, str, bool)) else str(value)


def write_best(sweep_dir: str, study: optuna.Study, score_name: str) -> str | None:
    """``best.yaml``: the config of the best complete trial of this machine as a preset, the threads the sweep set
    for its parallel trials taken out (``train`` then uses its own share of the cores). Returns the line to say."""
    complete = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.value is not None]
    local = [t for t in complete if os.path.isfile(os.path.join(str(t.user_attrs.get(RUN_DIR)), "config.yaml"))]
    if not local:
        return None
    best = max(local, key=lambda t: (t.value, -t.number))
    document = read_yaml_file(os.path.join(best.user_attrs[RUN_DIR], "config.yaml"))
    if best.user_attrs.get(THREADS_SET):
        document["config"]["gang"]["threads_per_rank"] = None
    score = best.user_attrs[SCORE]
    document["description"] = f"The best trial ({best.number}) of the sweep in {sweep_dir}: {score_name}={score:.6g}."
    path = os.path.join(sweep_dir, "best.yaml")
    write_text(path, dump_yaml(document))
    return f"Best: trial {best.number}, {score_name}={score:.6g}; its config as a preset: {path}"
