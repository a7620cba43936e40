"""TensorBoard event files under ``OUTPUT_DIR/tb/<run>``, one folder per run so curves overlay."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

from recipes.errors import WriteError
from recipes.recorders.base import RECORDERS, MetricRecorder, RecorderConfig, RecorderContext, flatten


class TensorBoardRecorder(MetricRecorder):
    """Writes scalars with the same tag names for every run, so ``train`` and ``valid`` overlay.

    ``purge_step`` is the first step a resumed run writes: TensorBoard hides older events
    from that step on, so a curve never doubles back over the steps a killed run had logged
    after its last checkpoint.
    """

    def __init__(self, log_dir: str, purge_step: int | None = None) -> None:
        self._log_dir = log_dir
        self._purge_step = purge_step
        self._writers: dict[str, SummaryWriter] = {}

    def _writer(self, run: str) -> SummaryWriter:
        from torch.utils.tensorboard import SummaryWriter  # Slow to import; a run that records none never does.

        if run not in self._writers:
            self._writers[run] = SummaryWriter(f"{self._log_dir}/{run}", purge_step=self._purge_step)
        return self._writers[run]

    def record(self, run: str, step_nr: int, values: Mapping[str, float]) -> None:
        try:
            writer = self._writer(run)
            for name, value in values.items():
                writer.add_scalar(name, value, step_nr)
            writer.flush()  # Raises what the writer's thread met writing.
        except OSError as ex:
            raise WriteError(f"{self._log_dir}/{run}", ex) from ex

    def record_config(self, config: Mapping[str, Any]) -> None:
        hparams = {k: ("null" if v is None else v) for k, v in flatten(config).items()}
        self._writer("train").add_hparams(hparams, {}, run_name=".")

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()


@RECORDERS.register("tensorboard")
def tensorboard(config: RecorderConfig, context: RecorderContext) -> MetricRecorder:
    """TensorBoard scalars and hyper-parameters under ``OUTPUT_DIR/tb/<run>``."""
    purge_step = None if context.resume_step is None else context.resume_step + 1
    return TensorBoardRecorder(f"{context.output_dir}/tb", purge_step=purge_step)
