"""Metrics of the rows of each group or slice: GAUC over groups (users), NE and calibration per slice.

A model can rank well over all rows (global AUC) by telling heavy users from light ones, and
still rank one user's items no better than chance: GAUC, the AUC within each group averaged
with the group's impressions (rows) as weights, measures the ranking a user sees. Groups whose
rows hold one class have no AUC and are left out, as TorchRec's ``gauc`` and FuxiCTR's ``gAUC``
leave them. NE and calibration per slice (device type, hour) show where a model is worse or
biased that the totals average away.

Both are exact over data-parallel ranks: GAUC keeps every row's group, score and label and
gathers them (a group's rows may be spread over every rank, and its AUC is that of their
union); a slice's sums add up over ranks. A metric that computes several values returns them
as a mapping from a suffix of its name to the value; ``MetricBag`` reports ``name + suffix``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torchmetrics import Metric
from torchmetrics.utilities.data import dim_zero_cat

from units.metrics import Undefinable, WithoutBetterSide, normalized_entropy

MAX_SLICES = 1000
"""The most distinct values a slice column may have: each is a curve of its own in every recorder."""


class TooManySlicesError(ValueError):
    """A slice column has more distinct values than ``MAX_SLICES``: it is not a slice but an id."""


class ByGroup:
    """A metric of the rows of each group of the column ``metrics.group_by`` names (GAUC: the AUC within each user).

    The recipe builds its metrics, so only it can honour ``metrics.group_by``; a run whose eval units hold no metric
    marked ``ByGroup`` stops at start-up rather than ignore the key. A metric of your own that groups by that column
    says so by deriving from this class too: ``class MyGroupedMetric(ByGroup, Metric)``.
    """


class BySlice:
    """A metric of the rows of each value of the column ``metrics.slice_by`` names (NE per device type).

    As ``ByGroup`` for ``metrics.slice_by``. It reports one value per slice (``compute()`` returns a mapping from the
    slice's suffix to its value: ``ne/mobile``) and none under its own name, so it cannot be the score that ranks
    checkpoints (``trainer.score_metric``), which is refused at start-up.
    """


def slice_label(text: str) -> str:
    """``text`` as the last part of a metric's name, which must work as a TensorBoard tag, a JSONL key and a WandB
    key alike: characters other than letters, digits, ``_``, ``.`` and ``-`` become ``_``."""
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", text) or "_"


def _flat(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return tensor.detach().reshape(-1).to(dtype)


def _same_rows(**tensors: torch.Tensor) -> None:
    sizes = {name: tensor.numel() for name, tensor in tensors.items()}
    if len(set(sizes.values())) > 1:
        raise ValueError(f"The arguments must have as many elements each, but have {sizes} instead.")


def per_group_auc(
    scores: torch.Tensor, targets: torch.Tensor, groups: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per distinct group (in increasing order): its ROC AUC, its number of rows, and whether it has both classes.

    The Mann-Whitney form, for every group at once: sort the rows by (group, score), rank them within their group
    (tied scores share their average rank, so a tie counts one half, as in AUC), and per group
    ``AUC = (sum of the positives' ranks - P (P + 1) / 2) / (P N)``. A group of one class has no AUC (NaN).
    """
    order = torch.argsort(scores, stable=True)
    order = order[torch.argsort(groups[order], stable=True)]
    groups, scores, targets = groups[order], scores[order], targets[order]
    num_rows = groups.numel()
    _, group_index, counts = torch.unique_consecutive(groups, return_inverse=True, return_counts=True)
    group_first = (torch.cumsum(counts, 0) - counts)[group_index]
    # Runs of rows with the same group and score: their ranks are averaged.
    new_run = torch.ones(num_rows, dtype=torch.bool, device=groups.device)
    new_run[1:] = (groups[1:] != groups[:-1]) | (scores[1:] != scores[:-1])
    run_first = torch.nonzero(new_run).reshape(-1)
    run_length = torch.diff(run_first, append=torch.tensor([num_rows], device=groups.device))
    run_index = torch.cumsum(new_run.to(torch.int64), 0) - 1
    first = run_first[run_index]
    rank = (first + (run_length[run_index] - 1) / 2.0 - group_first + 1).to(torch.float64)
    num_groups = counts.numel()
    positives = torch.zeros(num_groups, dtype=torch.float64, device=groups.device).index_add_(0, group_index, targets)
    rank_sum = torch.zeros_like(positives).index_add_(0, group_index, targets * rank)
    negatives = counts.to(torch.float64) - positives
    auc = (rank_sum - positives * (positives + 1) / 2) / (positives * negatives)
    return auc, counts, (positives > 0) & (negatives > 0)


class GroupedAUC(ByGroup, Undefinable, Metric):
    """GAUC: ``update(probabilities, targets, groups)``, ``groups`` an integer id per row (the user's).

    ``compute()`` gives ``{"": gauc, "_groups": number of groups counted}``; over no group with both
    classes, GAUC is NaN. Every row is kept until ``reset``, as an exact AUC keeps them.
    """

    full_state_update = False
    is_differentiable = False
    higher_is_better = True
    scores: list[torch.Tensor] | torch.Tensor
    targets: list[torch.Tensor] | torch.Tensor
    groups: list[torch.Tensor] | torch.Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("scores", default=[], dist_reduce_fx="cat")
        self.add_state("targets", default=[], dist_reduce_fx="cat")
        self.add_state("groups", default=[], dist_reduce_fx="cat")

    def update(self, probabilities: torch.Tensor, targets: torch.Tensor, groups: torch.Tensor) -> None:
        _same_rows(probabilities=probabilities, targets=targets, groups=groups)
        assert isinstance(self.scores, list) and isinstance(self.targets, list) and isinstance(self.groups, list)
        self.scores.append(_flat(probabilities, torch.float64))
        self.targets.append(_flat(targets, torch.float64))
        self.groups.append(_flat(groups, torch.int64))

    def compute(self) -> dict[str, torch.Tensor]:  # Several values, named by suffix.
        self.undefined_because = "no group holds both classes"
        if isinstance(self.scores, list) and not self.scores:
            return {"": torch.tensor(float("nan")), "_groups": torch.tensor(0.0)}
        scores, targets, groups = dim_zero_cat(self.scores), dim_zero_cat(self.targets), dim_zero_cat(self.groups)
        auc, counts, counted = per_group_auc(scores, targets, groups)
        weights = counts[counted].to(torch.float64)
        if not bool(counted.any()):
            return {"": torch.tensor(float("nan")), "_groups": torch.tensor(0.0, dtype=torch.float64)}
        self.undefined_because = None
        gauc = (auc[counted] * weights).sum() / weights.sum()
        return {"": gauc, "_groups": counted.sum().to(torch.float64)}


# Per slice: sums by slice value, merged by value after every update and after gathering ranks.
_LOSS, _TARGETS, _ROWS, _PREDICTIONS = range(4)


class SlicedSums(BySlice, Metric):
    """The sums behind NE and calibration per value of a slice column: ``update(logits, targets, slices)``.

    The state is one row of sums per slice value seen (``values``, ``sums``), so memory follows the
    number of slices, not of rows; a slice column with more than ``max_slices`` values raises
    ``TooManySlicesError`` (at the update that sees too many on one rank, or at ``compute`` over all).
    ``compute`` names each slice by ``names[value]`` where given, else by the value's decimal text;
    subclasses say what it makes of the sums, per slice value.
    """

    full_state_update = False
    is_differentiable = False
    values: list[torch.Tensor] | torch.Tensor
    sums: list[torch.Tensor] | torch.Tensor

    def __init__(
        self,
        column: str = "slice",
        names: Mapping[int, str] | None = None,
        max_slices: int = MAX_SLICES,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._column = column
        self._names = dict(names or {})
        self._max_slices = max_slices
        self.add_state("values", default=[], dist_reduce_fx="cat")
        self.add_state("sums", default=[], dist_reduce_fx="cat")

    def update(self, logits: torch.Tensor, targets: torch.Tensor, slices: torch.Tensor) -> None:
        _same_rows(logits=logits, targets=targets, slices=slices)
        logits, targets = _flat(logits, torch.float64), _flat(targets, torch.float64)
        losses = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
        rows = torch.stack([losses, targets, torch.ones_like(targets), torch.sigmoid(logits)], dim=1)
        assert isinstance(self.values, list) and isinstance(self.sums, list)
        values, sums = self._merged(
            torch.cat([*self.values, _flat(slices, torch.int64)]), torch.cat([*self.sums, rows])
        )
        self.values[:], self.sums[:] = [values], [sums]

    def _merged(self, values: torch.Tensor, sums: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        distinct, index = torch.unique(values, return_inverse=True)
        if distinct.numel() > self._max_slices:
            raise TooManySlicesError(
                f"`metrics.slice_by` must name a column of at most {self._max_slices} values, but '{self._column}' "
                f"has {distinct.numel()} or more; group by it instead (`metrics.group_by`)."
            )
        merged = torch.zeros((distinct.numel(), sums.shape[1]), dtype=torch.float64, device=sums.device)
        return distinct, merged.index_add_(0, index, sums)

    def compute(self) -> dict[str, torch.Tensor]:  # One value per slice.
        if isinstance(self.values, list) and not self.values:
            return {}
        values, sums = self._merged(dim_zero_cat(self.values), dim_zero_cat(self.sums))
        return {
            slice_label(self._names.get(value, str(value))): self.value_of(row)
            for value, row in zip(values.tolist(), sums)
        }

    def value_of(self, sums: torch.Tensor) -> torch.Tensor:
        """The metric of one slice from its sums (loss, targets, rows, predictions)."""
        raise NotImplementedError


class SlicedNormalizedEntropy(SlicedSums):
    """``NormalizedEntropy`` per slice value (the same definition: NaN for a slice of one class)."""

    higher_is_better = False

    def value_of(self, sums: torch.Tensor) -> torch.Tensor:
        return normalized_entropy(sums[_LOSS], sums[_TARGETS], sums[_ROWS])[0]


class SlicedCalibration(WithoutBetterSide, SlicedSums):
    """``Calibration`` per slice value: predicted clicks over actual clicks (NaN where a slice has none)."""

    def value_of(self, sums: torch.Tensor) -> torch.Tensor:
        positives = sums[_TARGETS]
        return torch.where(positives > 0.0, sums[_PREDICTIONS] / positives, float("nan"))
