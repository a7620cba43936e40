"""Compile the built-in presets' numba kernels into the shared cache once, before the test workers start.

On a fresh checkout the cache (``NUMBA_CACHE_DIR``) is empty, and the integration tests' first runs, started at
once by every worker, each compiled the same kernels: a fresh clone's suite took 13:38 against 11:24 with the cache
filled. A short run of each built-in preset, two at a time, fills it; the runs that follow load the kernels.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

from support.resume_helpers import recipes_env

# The presets whose kernels (readers, fixed and hash tables, their optimizers) most tests' runs use.
PRESETS = ("dlrm_criteo_tiny_dynamic", "movielens_small", "dlrm_criteo_tiny", "ctr_tiny")
SHORT = (
    "trainer.max_num_data_epochs=null",
    "trainer.max_num_steps=2",
    "trainer.validate_every_n_steps=2",
    "checkpoint.every_n_steps=null",
    "metrics.recorders.console=false",
)


def cache_is_empty() -> bool:
    """No kernel compiled into the cache yet (importing our modules makes its folders, empty)."""
    folder = os.environ.get("NUMBA_CACHE_DIR")
    return folder is None or not any(name.endswith(".nbi") for _, _, names in os.walk(folder) for name in names)


def warm_up(parallel: int = 2) -> list[str]:
    """Train each preset a few steps; the presets whose run failed (their tests will say why)."""
    with tempfile.TemporaryDirectory(prefix="numba-warmup-") as folder:

        def train(preset: str) -> int:
            command = [sys.executable, "-m", "recipes", "train", preset, "-o", f"{folder}/{preset}", *SHORT]
            if preset == "movielens_small":
                command.append("dataset.shuffle_buffer_size=1024")  # Not its 131,072 rows before the first step.
            return subprocess.run(command, cwd=folder, env=recipes_env(), capture_output=True, timeout=600).returncode

        with ThreadPoolExecutor(parallel) as pool:
            codes = list(pool.map(train, PRESETS))
    return [preset for preset, code in zip(PRESETS, codes) if code != 0]
