"""The console: a progress bar with step, loss, throughput and ETA, and a line per validation."""

from __future__ import annotations

from collections.abc import Mapping

from tqdm import tqdm

from recipes.recorders.base import RECORDERS, CompositeRecorder, MetricRecorder, RecorderConfig, RecorderContext


class ConsoleRecorder(MetricRecorder):
    """Shows the train metrics on the bar and prints other runs as lines above it."""

    def __init__(self, total_steps: int | None, initial_step: int = 0) -> None:
        self._total_steps = total_steps
        self._initial_step = initial_step
        self._bar: tqdm | None = None  # Made at the first record, so a run that fails to start shows none.

    def record(self, run: str, step_nr: int, values: Mapping[str, float]) -> None:
        if self._bar is None:
            self._bar = tqdm(total=self._total_steps, initial=self._initial_step, unit="step", dynamic_ncols=True)
        if run == "train":
            self._bar.update(step_nr - self._bar.n)
            shown = {k: values[k] for k in ("loss", "throughput", "lr") if k in values}
            self._bar.set_postfix({k: f"{v:.4g}" for k, v in shown.items()}, refresh=True)
        else:
            text = " ".join(f"{name}={value:.4g}" for name, value in values.items())
            self._bar.write(f"step {step_nr} {run}: {text}")

    def record_window(self, run: str, step_nr: int, window: str, values: Mapping[str, float]) -> None:
        self.record(f"{run} {window}", step_nr, values)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


@RECORDERS.register("console")
def console(config: RecorderConfig, context: RecorderContext) -> MetricRecorder:
    """A progress bar with step, loss, throughput and ETA, and a line per validation."""
    if not context.training:
        return CompositeRecorder([])  # eval and predict print their results themselves.
    return ConsoleRecorder(context.max_num_steps, initial_step=context.resume_step or 0)
