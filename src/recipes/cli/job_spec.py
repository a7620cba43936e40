"""What the user asked for on the command line, before anything is resolved or imported for it.

Apart from :mod:`recipes.cli.job`, which imports the framework: the launcher of ``train --nproc`` needs only this.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class JobSpec:
    """What the user asked for on the command line."""

    preset: str
    output_dir: str | None = None
    config_files: Sequence[str] = ()
    overrides: Sequence[str] = ()


def default_output_dir(spec: JobSpec) -> str:
    return spec.output_dir or os.path.join("runs", Path(spec.preset).stem)
