"""One JSON object per published step in ``OUTPUT_DIR/metrics/<run>.jsonl``, through fsspec."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

import fsspec

from recipes.errors import UserError, WriteError
from recipes.recorders.base import RECORDERS, MetricRecorder, RecorderConfig, RecorderContext

log = logging.getLogger(__name__)


class JsonlRecorder(MetricRecorder):
    """Appends ``{"step": N, metric: value, ...}`` lines.

    On resume from step ``resume_step``, lines of later steps (written by the run that was
    stopped after its last checkpoint) are dropped first, so the history reads as one run.
    """

    def __init__(self, metrics_dir: str, resume_step: int | None = None) -> None:
        self._dir = metrics_dir.rstrip("/")
        self._fs, self._root = fsspec.core.url_to_fs(self._dir)
        self._fs.makedirs(self._root, exist_ok=True)
        for stale in self._fs.glob(f"{self._root}/*.jsonl.rewrite"):  # a rewrite a kill cut short: ours
            self._fs.rm(stale)
        if resume_step is not None:
            for path in self._fs.glob(f"{self._root}/*.jsonl"):
                self._truncate_after(path, resume_step)

    def _truncate_after(self, path: str, step_nr: int) -> None:
        """Keep the lines up to ``step_nr``, and drop a torn last line.

        A run killed while writing leaves its last line cut short; it is the only line a
        killed run can damage, so it is dropped with a warning rather than stopping every
        later resume. A broken line before it was not written by this recorder, and stops the
        run naming it.
        """
        with self._fs.open(path, "r") as f:
            lines = f.read().splitlines()
        kept = []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                step = json.loads(line)["step"]
                if not isinstance(step, int):
                    raise TypeError(f"its step is {step!r}")
            except (ValueError, KeyError, TypeError) as ex:
                if number < len(lines):
                    raise UserError(
                        f"Line {number} of {path} must be a JSON object with an integer step, but is {line[:80]!r} "
                        f"instead ({ex}); fix or move the file to resume."
                    ) from None
                log.warning("Dropped the torn last line %d of %s, cut short when a run was killed.", number, path)
                continue
            if step <= step_nr:
                kept.append(line + "\n")
        # Written aside and renamed: a kill during the rewrite must not leave the file empty, its rows lost.
        aside = f"{path}.rewrite"
        with self._fs.open(aside, "w") as f:
            f.writelines(kept)
        self._fs.mv(aside, path)

    def record(self, run: str, step_nr: int, values: Mapping[str, float]) -> None:
        self._append(run, {"step": step_nr, **values})

    def record_window(self, run: str, step_nr: int, window: str, values: Mapping[str, float]) -> None:
        self._append(run, {"step": step_nr, "window": window, **values})

    def _append(self, run: str, row: Mapping[str, object]) -> None:
        line = json.dumps(row, allow_nan=True)
        path = f"{self._root}/{run}.jsonl"
        try:
            with self._fs.open(path, "a") as f:
                f.write(line + "\n")
        except OSError as ex:
            raise WriteError(path, ex) from ex


@RECORDERS.register("jsonl")
def jsonl(config: RecorderConfig, context: RecorderContext) -> MetricRecorder:
    """One JSON object per published step in ``OUTPUT_DIR/metrics/<run>.jsonl``."""
    return JsonlRecorder(f"{context.output_dir}/metrics", resume_step=context.resume_step)
