"""The Trainer's own metrics: the loss, the gradient norm, throughput and the share of skipped steps.

The steps since the last publish or checkpoint are added up as plain numbers and handed to the metric bag in one
update each when it is read: a torchmetrics update per metric per step cost more than the rest of the loop's own
bookkeeping.
"""

from __future__ import annotations

from gang import Gang
from units import Mean, MetricBag, Throughput


class TrainMetrics:
    """The metric bag of the Trainer's own metrics (checkpointed with its unreduced state), reduced over ``dp``,
    and the totals of the steps not yet handed to it. ``grad_norm`` is there only ``with_grad_norm``: the norm is
    taken only where the gradients are clipped."""

    def __init__(self, dp: Gang, with_grad_norm: bool) -> None:
        self.bag = MetricBag(dp)
        self.bag.register("loss", Mean())
        if with_grad_norm:
            self.bag.register("grad_norm", Mean())
        self.bag.register("throughput", Throughput())
        self.bag.register("num_skipped_steps", Mean())
        self._reset_totals()

    def _reset_totals(self) -> None:
        self._loss_sum = 0.0
        self._num_targets = 0
        self._grad_norm_sum = 0.0
        self._num_updates = 0
        self._num_skipped = 0

    def add_step(self, loss_sum: float, num_targets: int, grad_norm: float | None) -> None:
        """A step that updated the model: its summed loss, its targets, and its gradient norm if taken."""
        self._loss_sum += loss_sum
        self._num_targets += num_targets
        if grad_norm is not None:
            self._grad_norm_sum += grad_norm
        self._num_updates += 1

    def add_skipped_step(self) -> None:
        """A step skipped for a loss that is not finite."""
        self._num_skipped += 1

    def flushed(self) -> MetricBag:
        """The metric bag, with the steps' totals handed to it (before it is published or checkpointed)."""
        bag = self.bag
        if self._num_updates > 0:
            bag["loss"].update(self._loss_sum / max(self._num_targets, 1), weight=self._num_targets)
            if "grad_norm" in bag:
                bag["grad_norm"].update(self._grad_norm_sum / self._num_updates, weight=self._num_updates)
            bag["throughput"].update(self._num_targets)
        num_steps = self._num_updates + self._num_skipped
        if num_steps > 0:
            bag["num_skipped_steps"].update(self._num_skipped / num_steps, weight=num_steps)
        self._reset_totals()
        return bag
