"""When the Trainer saves a checkpoint: the config's ``checkpoint`` periods as one object the Trainer asks.

The Trainer decides *that* a step is done, a window ended or training ends; this schedule decides whether a
checkpoint is due then, as the validator decides what a validation concludes. It remembers the last save, because
that is what decides at a window's end (not the same step twice) and at the end of training or on a stop request
(a final checkpoint once, even where the periods just saved a non-final one at that step).
"""

from __future__ import annotations

from recipes.config.sections import CheckpointSection


def period_ended(
    every_n_steps: int | None, every_n_data_epochs: int | None, step_nr: int, data_epoch_nr: int, epoch_ended: bool
) -> bool:
    """Whether ``step_nr`` or, where a data epoch just ended, ``data_epoch_nr`` reached a multiple of its period
    (``None``: no such period); validation and checkpoints count their periods alike."""
    if every_n_steps is not None and step_nr % every_n_steps == 0:
        return True
    return epoch_ended and every_n_data_epochs is not None and data_epoch_nr % every_n_data_epochs == 0


class CheckpointSchedule:
    """Checkpoints every ``every_n_steps`` steps, every ``every_n_data_epochs`` data epochs, every
    ``every_n_windows`` windows of data, at a validation that beats the best score with ``at_new_best``, and once
    more, final, at the end of training or on a stop request. One per Trainer: it remembers the Trainer's saves.
    """

    def __init__(
        self,
        every_n_steps: int | None = None,
        every_n_data_epochs: int | None = None,
        every_n_windows: int | None = None,
        at_new_best: bool = False,
    ) -> None:
        self.every_n_steps = every_n_steps
        self.every_n_data_epochs = every_n_data_epochs
        self.every_n_windows = every_n_windows
        self.at_new_best = at_new_best
        """The best checkpoint is then the best validation, whatever the periods (``checkpoint.keep_best_n``)."""
        self._saved_step = -1
        self._saved_final = False

    @classmethod
    def of(cls, section: CheckpointSection) -> CheckpointSchedule:
        """The schedule that ``checkpoint`` configures; keeping the best checkpoints saves each new best."""
        return cls(
            section.every_n_steps, section.every_n_data_epochs, section.every_n_windows, section.keep_best_n is not None
        )

    def due_after_step(self, step_nr: int, data_epoch_nr: int, epoch_ended: bool, new_best: bool) -> bool:
        """Whether the step just taken (whose validation, if any, beat the best score with ``new_best``) saves."""
        if new_best and self.at_new_best:
            return True
        return period_ended(self.every_n_steps, self.every_n_data_epochs, step_nr, data_epoch_nr, epoch_ended)

    def due_after_window(self, step_nr: int, num_windows_done: int) -> bool:
        """Whether the end of the ``num_windows_done``-th window, at ``step_nr``, saves (before the next window is
        waited for, so that a kill while waiting loses nothing); a step the schedule saved already is not saved
        again."""
        every = self.every_n_windows
        return every is not None and num_windows_done % every == 0 and self._saved_step != step_nr

    def due_at_end(self, step_nr: int) -> bool:
        """Whether training that ends (or stops on request) at ``step_nr`` still needs its final checkpoint: the last
        one is saved as such (a full one, even when the others are model-only)."""
        return self._saved_step != step_nr or not self._saved_final

    def saved(self, step_nr: int, final: bool) -> None:
        """The Trainer saved a checkpoint at ``step_nr``, the last of training with ``final`` (or resumed from one,
        which was saved so)."""
        self._saved_step = step_nr
        self._saved_final = final
