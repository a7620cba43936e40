"""WandB runs: offline under ``OUTPUT_DIR/wandb`` unless a project and an online mode are configured."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from recipes.recorders.base import RECORDERS, CompositeRecorder, MetricRecorder, RecorderConfig, RecorderContext


@dataclass
class WandbConfig(RecorderConfig):
    enabled: bool = False
    """Whether the run records to WandB (off unless turned on)."""
    project: str | None = None
    """With a project, and ``mode: online``, runs go to the WandB server; else offline under ``OUTPUT_DIR/wandb``."""
    entity: str | None = None
    """The WandB entity (user or team) of the run."""
    run_name: str | None = None
    """The WandB run's name; ``None``: WandB's own."""
    mode: Literal["offline", "online", "disabled"] = "offline"
    """``offline``, ``online`` (needs a project and a key) or ``disabled``."""


class WandbRecorder(MetricRecorder):
    """Logs ``<run>/<metric>`` at each step; the resolved config is the WandB run's config."""

    def __init__(
        self, output_dir: str, project: str | None, entity: str | None, run_name: str | None, mode: str
    ) -> None:
        import wandb  # Imported here: it is slow to import and most runs do not use it.

        self._wandb = wandb
        directory = os.path.join(output_dir, "wandb")
        os.makedirs(directory, exist_ok=True)
        os.environ.setdefault("WANDB_CACHE_DIR", os.path.join(directory, ".cache"))
        os.environ.setdefault("WANDB_CONFIG_DIR", os.path.join(directory, ".config"))
        if project is None and mode == "online":
            mode = "offline"  # Nowhere to send it: keep it on disk rather than fail.
        self._run = wandb.init(
            project=project or "recipes",
            entity=entity,
            name=run_name,
            dir=output_dir,
            mode=mode,  # type: ignore[arg-type]
            reinit="finish_previous",
            settings=wandb.Settings(silent=True, console="off"),
        )

    def record(self, run: str, step_nr: int, values: Mapping[str, float]) -> None:
        self._run.log({f"{run}/{name}": value for name, value in values.items()}, step=step_nr)

    def record_config(self, config: Mapping[str, Any]) -> None:
        self._run.config.update(dict(config), allow_val_change=True)

    def close(self) -> None:
        self._run.finish()


@RECORDERS.register("wandb", WandbConfig)
def wandb(config: WandbConfig, context: RecorderContext) -> MetricRecorder:
    """Records to WandB: online with a ``project`` and ``mode: online``, else offline under ``OUTPUT_DIR/wandb``."""
    if config.mode == "disabled":
        return CompositeRecorder([])
    return WandbRecorder(context.output_dir, config.project, config.entity, config.run_name, config.mode)
