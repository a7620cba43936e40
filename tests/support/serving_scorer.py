"""The serving tutorial's plain-torch scorer of an export, run as its text has it, and a split's rows read as it
takes them."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from recipes.cli.job_spec import JobSpec
from recipes.cli.scoring import loaded_checkpoint
from support.paths import DOCS

SERVING = DOCS / "tutorials" / "serving.md"


def tutorial_scorer() -> SimpleNamespace:
    """``load``, ``score`` and ``read_rows`` of the first Python block of the serving tutorial, executed."""
    match = re.search(r"```python\n(.*?)```", SERVING.read_text(), re.DOTALL)
    assert match is not None, "the serving tutorial must hold a Python block"
    code = match.group(1)
    imported = {line.split()[1].split(".")[0] for line in code.splitlines() if line.startswith(("import ", "from "))}
    assert imported == {"json", "pyarrow", "torch"}, imported  # nothing of this project
    namespace: dict[str, Any] = {}
    exec(compile(code, "docs/tutorials/serving.md", "exec"), namespace)
    return SimpleNamespace(
        load=namespace["load"],
        score=namespace["score"],
        read_rows=namespace["read_rows"],
        num_lines=len(code.splitlines()),
    )


def split_rows(run: Path, split: str = "valid") -> list[tuple[torch.Tensor, dict[str, Any]]]:
    """Every batch of ``split`` as the scorer takes it, in input order: the dense features and, per feature, its ids,
    offsets and weights (read by the run's own readers, in this process)."""
    spec = JobSpec(str(run / "config.yaml"), str(run))
    batches = []
    with loaded_checkpoint(spec, "last", split, one_unit=True) as loaded:
        validation = next(iter(loaded.validations.values()))
        for step in validation.reader:
            for batch in step:
                features = {name: (f.ids.clone(), f.offsets.clone(), f.weights) for name, f in batch.sparse.items()}
                batches.append((batch.dense.clone(), features))
        validation.reader.reset()
    return batches


def scores(scorer: SimpleNamespace, model: Any, rows: list[tuple[torch.Tensor, dict[str, Any]]]) -> np.ndarray:
    return np.concatenate([scorer.score(model, dense, features).numpy() for dense, features in rows])
