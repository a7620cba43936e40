"""The Trainer: one explicit loop that decides when to step, publish, validate, checkpoint and stop.

Everything model-specific is in the units; everything about where things go (recorders,
checkpoints) is behind small interfaces; validation is the validator's, when to checkpoint the
``CheckpointSchedule``'s, moving from one window of data to the next ``OnlineWindows``', and what a
checkpoint holds is ``TrainingState``'s. What is left is the loop, readable top to bottom in
``run()``, in the manner of fairseq2's Trainer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from gang import Gangs, ReduceOperation
from recipes.config.sections import TrainerSection
from recipes.recorders import MetricRecorder
from recipes.training.checkpoint_schedule import CheckpointSchedule, period_ended
from recipes.training.data_reader import DataError, DataReader
from recipes.training.mean_gradients import MeanGradients
from recipes.training.parallel import gradient_sync, step_sums, tensors_changed_by_step
from recipes.training.precision import autocast_for
from recipes.training.profiler import Profiler
from recipes.training.protocols import NOOP_CHECKPOINTER, Checkpointer, ShardedStateful, TracksChangedRows, Validation
from recipes.training.step_checks import ConfiguredBatchSize, StepChecks
from recipes.training.step_sums import local_step_stats, read_step_stats, step_stats
from recipes.training.train_metrics import TrainMetrics
from recipes.training.trainer_state import TrainerCounters, TrainingState
from recipes.training.validator import NOOP_VALIDATOR, Validator
from recipes.training.windows import OnlineWindows
from units import TrainUnit

if TYPE_CHECKING:
    from recipes.checkpointing.model_bank import ModelBank

# Validation, Checkpointer and ShardedStateful live in recipes.training.protocols; importing them from here still works.
__all__ = ["Checkpointer", "LossNotFiniteError", "ShardedStateful", "Trainer", "Validation"]

log = logging.getLogger(__name__)

BatchT = TypeVar("BatchT")


class LossNotFiniteError(RuntimeError):
    """The loss became NaN or infinite and the NaN policy says to stop."""


class Trainer(Generic[BatchT]):
    """Trains ``unit`` on ``data_reader`` until a step limit, an epoch limit, early stopping or a stop request.

    ``state_metrics`` gives values that describe the state at a publish rather than the steps since
    the last one (a hash table's rows in use, say); every rank calls it, so it may be collective.
    ``checkpoints`` says when ``checkpointer`` saves (only at the end of training by default); ``reloads``
    are the model bank's periodic reloads (``checkpoint.reload_every_n_*``), before anything sees the step.
    """

    def __init__(
        self,
        *,
        unit: TrainUnit[BatchT],
        data_reader: DataReader[BatchT],
        optimizer: Optimizer,
        lr_scheduler: LRScheduler,
        gangs: Gangs,
        device: torch.device,
        config: TrainerSection,
        recorder: MetricRecorder,
        profiler: Profiler,
        validator: Validator = NOOP_VALIDATOR,
        sharded_state: Mapping[str, ShardedStateful] | None = None,
        checkpointer: Checkpointer = NOOP_CHECKPOINTER,
        checkpoints: CheckpointSchedule | None = None,
        state_metrics: Callable[[], Mapping[str, float]] = dict,
        reloads: ModelBank | None = None,
        batch_size: ConfiguredBatchSize | None = None,
    ) -> None:
        self._unit = unit
        self._reader = data_reader
        self._optimizer = optimizer
        self._lr_scheduler = lr_scheduler
        self._gangs = gangs
        self._config = config
        self._recorder = recorder
        self._profiler = profiler
        self._validator = validator
        self._checkpointer = checkpointer
        self._checkpoints = checkpoints or CheckpointSchedule()
        self._state_metrics = state_metrics
        self._windows = OnlineWindows.of(data_reader, gangs.root, validator, config.max_num_windows)
        self._reloads = reloads
        self._checks = StepChecks(unit, gangs.dp, batch_size)
        self._step_sums = step_sums(unit.model)
        """Where DDP syncs the gradients, the channel that sums ``_agree_on_step``'s values with them."""
        self._improved_step = -1
        self._autocast = autocast_for(config.mixed_precision, device)
        self._grad_scaler = torch.amp.GradScaler(device.type, enabled=config.mixed_precision == "fp16")
        self._gradients = MeanGradients(optimizer, self._grad_scaler, gangs.dp.size, config.max_grad_norm)
        self._metrics = TrainMetrics(gangs.dp, with_grad_norm=config.max_grad_norm is not None)

        self.state = TrainingState(
            model=unit.model,
            optimizer=optimizer,
            lr_scheduler=lr_scheduler,
            grad_scaler=self._grad_scaler,
            counters=TrainerCounters(),
            validator=validator,
            reader=data_reader,
            metrics=self._metrics.bag,
            unit_metrics=unit.metric_bag,
            sharded=dict(sharded_state or {}),
        )
        """What a checkpoint holds; ``checkpointing.resume`` loads it."""
        self._steps_in_epoch = 0
        self._stop_requested = False
        self._stop_agreed = False
        self._published_step = -1
        self._validated_step = -1

    @property
    def _counters(self) -> TrainerCounters:
        return self.state.counters

    @property
    def step_nr(self) -> int:
        return self._counters.step_nr

    def request_stop(self) -> None:
        """Ask the trainer to stop after the next step's agreement, save a checkpoint and return.

        A signal handler calls it; every rank stops after the same step.
        """
        self._stop_requested = True

    def load_state(
        self, shared: Mapping[str, Any], own: Mapping[str, Any], all_ranks: Sequence[Mapping[str, Any]]
    ) -> None:
        """Continue after a checkpoint: its shared state, this rank's, and every saving rank's (for the shards)."""
        self.state.load_shared(shared)
        self.state.load_per_rank(own, all_ranks)
        self._steps_in_epoch = 1  # Unknown, but the checkpointed run took steps: an epoch that ends now is no error.
        # The checkpoint's step was published, validated and saved, as a resumable checkpoint.
        self._published_step = self._validated_step = self.step_nr
        self._checkpoints.saved(self.step_nr, final=True)

    # The loop -------------------------------------------------------------------------------

    def run(self) -> None:
        """Train until a stop condition; then publish, validate and checkpoint whatever the last step left."""
        log.info("Training starts at step %d (data epoch %d).", self.step_nr, self._counters.data_epoch_nr)
        if self._windows is not None:
            self._windows.announce()
        self._unit.model.train()
        with self._profiler, torch.autograd.set_detect_anomaly(self._config.anomaly_detection):
            while not self._should_stop():
                epoch_ended = self._run_step()
                if epoch_ended is None:
                    break  # The last data epoch is done.
                self._profiler.step()
                self._after_step(epoch_ended)
        self._finish()

    def _should_stop(self) -> bool:
        """Whether the step just taken is the last: the step limit, early stopping or an agreed stop request."""
        max_steps = self._config.max_num_steps
        counters = self._counters
        return counters.early_stopped or self._stop_agreed or (max_steps is not None and counters.step_nr >= max_steps)

    def _after_step(self, epoch_ended: bool) -> None:
        """What the step may have made due: the model bank's reloads, a publish, a validation, a checkpoint."""
        step_nr, epoch_nr, config = self.step_nr, self._counters.data_epoch_nr, self._config
        if self._reloads is not None:
            self._reloads.after_step(step_nr, epoch_ended, epoch_nr)
        if step_nr % config.publish_metrics_every_n_steps == 0:
            self._publish_metrics()
        if period_ended(
            config.validate_every_n_steps, config.validate_every_n_data_epochs, step_nr, epoch_nr, epoch_ended
        ):
            self._validate()
        if self._checkpoints.due_after_step(step_nr, epoch_nr, epoch_ended, new_best=self._improved_step == step_nr):
            self._checkpoint(last=self._should_stop())

    def _finish(self) -> None:
        if self._stopped_on_request():
            # A stop is no event of training: nothing is published or validated that the run would not have
            # at this step; the checkpoint (unless the schedule just saved one) is a resume point only.
            if self._checkpoints.due_at_end(self.step_nr):
                self._checkpoint(last=True, interrupted=True)
            log.info("Training stopped at step %d on request.", self.step_nr)
            return
        if self._published_step != self.step_nr:
            self._publish_metrics()
        if self._validated_step != self.step_nr:
            self._validate()
        if self._checkpoints.due_at_end(self.step_nr):
            self._checkpoint(last=True)
        log.info("Training ends at step %d.", self.step_nr)

    def _stopped_on_request(self) -> bool:
        """Whether the run stops only because it was asked to: no step limit or early stop ends it here too."""
        max_steps = self._config.max_num_steps
        at_limit = max_steps is not None and self.step_nr >= max_steps
        return self._stop_agreed and not self._counters.early_stopped and not at_limit

    # One step -------------------------------------------------------------------------------

    def _run_step(self) -> bool | None:
        """Run one optimizer step; ``None`` when the data has run out, else whether an epoch ended first."""
        batches, epoch_ended = self._next_batches()
        if batches is None:
            return None
        self._counters.step_nr += 1
        self._unit.set_step_nr(self.step_nr)

        loss_sum, num_targets = self._forward_backward(batches)
        loss_is_finite, total_targets = self._agree_on_step(loss_sum, num_targets)
        if not loss_is_finite:
            self._skip_step(loss_sum)
            return epoch_ended
        self._counters.num_consecutive_skipped = 0

        grad_norm = self._gradients.normalize_and_clip(total_targets)
        self._checkpointer.wait_until_staged()
        self._grad_scaler.step(self._optimizer)
        self._grad_scaler.update()
        self._lr_scheduler.step()
        self._optimizer.zero_grad(set_to_none=True)
        self._metrics.add_step(loss_sum, num_targets, grad_norm)
        return epoch_ended

    def _next_batches(self) -> tuple[list[BatchT] | None, bool]:
        try:
            batches = next(self._reader)
            self._steps_in_epoch += 1
            return batches, False
        except StopIteration:
            pass
        if self._windows is not None:
            first_of_window, self._stop_agreed = self._windows.next_step(
                self.step_nr, lambda: self._stop_requested, self._window_ended
            )
            return first_of_window, False
        if self._steps_in_epoch == 0:
            raise DataError(self._no_step_message())
        self._steps_in_epoch = 0
        self._counters.data_epoch_nr += 1
        log.info("Data epoch %d is done.", self._counters.data_epoch_nr)
        max_epochs = self._config.max_num_data_epochs
        if max_epochs is not None and self._counters.data_epoch_nr >= max_epochs:
            return None, True
        self._reader.reset()
        try:
            batches = next(self._reader)
        except StopIteration:
            raise DataError(self._no_step_message()) from None
        self._steps_in_epoch = 1
        return batches, True

    def _no_step_message(self) -> str:
        described = self._reader.describe()
        what = f" ({described})" if described else ""
        return f"The training data fills no step of a data epoch{what}: is it empty, or smaller than one step?"

    def _forward_backward(self, batches: list[BatchT]) -> tuple[float, int]:
        """The step's summed loss and its targets, each micro-batch back-propagated. The sum is read once, after
        the last backward: a read waits for the device, and that one tells whether the loss is finite."""
        losses = []
        num_targets = 0
        for index, batch in enumerate(batches):
            is_last = index == len(batches) - 1
            with gradient_sync(self._unit.model, enabled=is_last), self._autocast():
                loss, batch_targets = self._checks.summed_loss(batch, is_last)
            losses.append(loss.detach())
            num_targets += batch_targets
            if is_last:
                loss_total = torch.stack(losses).double().sum()
                if self._step_sums is not None:  # summed with the gradients by this backward
                    self._step_sums.offer(step_stats(loss_total, self._stop_requested, num_targets))
            self._grad_scaler.scale(loss).backward()
        return float(loss_total), num_targets

    def _agree_on_step(self, loss_sum: float, num_targets: int) -> tuple[bool, float]:
        """One collective for what every rank must agree on after the backward pass (none under DDP, whose
        gradient sync summed the values offered before the last backward: ``training.step_sums``): whether the loss
        is finite on every rank (so all step or skip together), whether any rank was asked to stop (a signal
        reaches ranks at different times), and the targets of the global step. Every DP replica is counted once by
        each of its TP ranks, which see the same data. A single process has no one to agree with: no tensor."""
        summed = None if self._step_sums is None else self._step_sums.take()
        if summed is None and self._gangs.root.size == 1:
            values = local_step_stats(loss_sum, self._stop_requested, num_targets)
        else:
            if summed is None:
                summed = step_stats(torch.tensor(loss_sum, dtype=torch.float64), self._stop_requested, num_targets)
                summed = summed.to(self._gangs.root.device)
                self._gangs.root.all_reduce(summed, ReduceOperation.SUM)
            values = summed.tolist()
        finite, self._stop_agreed, total_targets = read_step_stats(values)
        return finite, total_targets / self._gangs.tp.size

    def _skip_step(self, loss_sum: float) -> None:
        self._optimizer.zero_grad(set_to_none=True)
        if self._config.nan_policy == "stop":
            raise LossNotFiniteError(
                f"The loss is {loss_sum} at step {self.step_nr}; stopping (trainer.nan_policy=stop). "
                "Set trainer.nan_policy=skip to skip such steps."
            )
        self._counters.num_consecutive_skipped += 1
        self._metrics.add_skipped_step()
        log.warning("The loss is %s at step %d; the step is skipped.", loss_sum, self.step_nr)
        limit = self._config.max_consecutive_skipped_steps
        if self._counters.num_consecutive_skipped >= limit:
            raise LossNotFiniteError(
                f"The loss was not finite for {limit} steps in a row (up to step {self.step_nr}); stopping."
            )

    # Metrics, validation, checkpoints ---------------------------------------------------------

    def _publish_metrics(self) -> None:
        metrics = self._metrics.flushed()
        values = metrics.compute()
        values.update(self._unit.metric_bag.compute())
        values["lr"] = float(self._lr_scheduler.get_last_lr()[0])
        values["data_epoch"] = float(self._counters.data_epoch_nr)
        values.update(self._state_metrics())
        metrics.reset()
        self._unit.metric_bag.reset()
        if self._gangs.root.rank == 0:
            self._recorder.record("train", self.step_nr, values)
        self._published_step = self.step_nr

    def _validate(self) -> None:
        """Validate, keep the score for the checkpoint of this step, and stop early if the validator says so."""
        validated = self._validator.validate(self.step_nr)
        self._validated_step = self.step_nr
        self._counters.last_score = validated.score
        if validated.score is not None and self._improves(validated.score):
            self._counters.best_score = validated.score
            self._improved_step = self.step_nr
        if validated.stop:
            log.info("Early stopping at step %d: the score stopped improving.", self.step_nr)
            self._counters.early_stopped = True

    def _improves(self, score: float) -> bool:
        best = self._counters.best_score
        if best is None:
            return True
        return score < best if self._config.lower_better else score > best

    def _window_ended(self, num_windows_done: int) -> None:
        """A window ended and training goes on: the next window trains on the model bank's newest state; the
        schedule may save this one."""
        if self._reloads is not None:
            self._reloads.after_window(num_windows_done)
        if self._checkpoints.due_after_window(self.step_nr, num_windows_done):
            self._checkpoint(last=False)

    def _checkpoint(self, last: bool, interrupted: bool = False) -> None:
        score = self._counters.last_score if self._validated_step == self.step_nr else None
        changed_by_step = {tensor.untyped_storage().data_ptr() for tensor in tensors_changed_by_step(self._optimizer)}
        tracking = any(isinstance(stateful, TracksChangedRows) for stateful in self.state.sharded.values())
        base_step = self._checkpointer.delta_base(self.step_nr) if tracking else None
        self._metrics.flushed()  # Their unreduced state is checkpointed.
        self._checkpointer.save(
            self.step_nr,
            score,
            self.state.shared(),
            self.state.per_rank(base_step),
            last,
            unchanged_until_staged=lambda tensor: tensor.untyped_storage().data_ptr() in changed_by_step,
            interrupted=interrupted,
            base_step=base_step,
        )
        self._checkpoints.saved(self.step_nr, final=last)
