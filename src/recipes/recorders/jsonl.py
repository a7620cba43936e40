"""One JSON object per published step in ``OUTPUT_DIR/metrics/<run>.jsonl``, through fsspec."""

from __future__ import annotations

import json
from collections.abc import Mapping

import fsspec

from recipes.recorders.base import MetricRecorder


class JsonlRecorder(MetricRecorder):
    """Appends ``{"step": N, metric: value, ...}`` lines.

    On resume from step ``resume_step``, lines of later steps (written by the run that was
    stopped after its last checkpoint) are dropped first, so the history reads as one run.
    """

    def __init__(self, metrics_dir: str, resume_step: int | None = None) -> None:
        self._dir = metrics_dir.rstrip("/")
        self._fs, self._root = fsspec.core.url_to_fs(self._dir)
        self._fs.makedirs(self._root, exist_ok=True)
        if resume_step is not None:
            for path in self._fs.glob(f"{self._root}/*.jsonl"):
                self._truncate_after(path, resume_step)

    def _truncate_after(self, path: str, step_nr: int) -> None:
        with self._fs.open(path, "r") as f:
            lines = [line for line in f if line.strip() and json.loads(line)["step"] <= step_nr]
        with self._fs.open(path, "w") as f:
            f.writelines(lines)

    def record(self, run: str, step_nr: int, values: Mapping[str, float]) -> None:
        line = json.dumps({"step": step_nr, **values}, allow_nan=True)
        with self._fs.open(f"{self._root}/{run}.jsonl", "a") as f:
            f.write(line + "\n")
