"""Which checkpoints to keep after a save: the union of keep-last-N, keep-best-N and keep-every-N-steps."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from checkpoint.errors import CheckpointError
from checkpoint.metadata import CheckpointMetadata


@dataclass(frozen=True)
class CheckpointPolicy:
    """What to keep; a checkpoint stays if any set rule keeps it, and with no rule set, all stay.

    Whatever the rules, the newest checkpoint and the newest resumable one are never deleted,
    so that a crashed run can always resume, nor the base of a kept one (``base_of_kept``), which
    reading it needs. A checkpoint saved because the run was stopped
    (``interrupted``) is a resume point only: no rule counts it, and it goes once a later one is
    saved, so that a stopped and resumed run keeps the checkpoints of a run never stopped.
    """

    keep_last_n: int | None = None
    keep_best_n: int | None = None
    keep_every_n_steps: int | None = None
    lower_better: bool = False
    """Whether a lower score is better (a loss) rather than a higher one (an AUC)."""

    def __post_init__(self) -> None:
        for name in ("keep_last_n", "keep_best_n", "keep_every_n_steps"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise CheckpointError(f"`{name}` must be None or an integer >= 1, but is {value!r} instead.")

    @property
    def keeps_all(self) -> bool:
        return self.keep_last_n is None and self.keep_best_n is None and self.keep_every_n_steps is None

    def ranked_by_score(self, checkpoints: Sequence[CheckpointMetadata]) -> list[CheckpointMetadata]:
        """The scored checkpoints, best first; on equal scores the earlier step ranks first."""
        scored = [c for c in checkpoints if c.score is not None]
        sign = 1.0 if self.lower_better else -1.0
        return sorted(scored, key=lambda c: (sign * c.score if c.score is not None else 0.0, c.step))

    def reasons_to_keep(self, checkpoints: Sequence[CheckpointMetadata]) -> dict[int, tuple[str, ...]]:
        """For each step in ``checkpoints``, the names of the rules that keep it (empty: delete it)."""
        by_step = sorted(checkpoints, key=lambda c: c.step)
        reasons: dict[int, list[str]] = {c.step: [] for c in by_step}
        if not by_step:
            return {}
        regular = [c for c in by_step if not c.interrupted]
        if self.keeps_all:
            for c in regular:
                reasons[c.step].append("keep_all")
        if self.keep_last_n is not None:
            for c in regular[-self.keep_last_n :]:
                reasons[c.step].append("keep_last_n")
        if self.keep_best_n is not None:
            for c in self.ranked_by_score(regular)[: self.keep_best_n]:
                reasons[c.step].append("keep_best_n")
        if self.keep_every_n_steps is not None:
            for c in regular:
                if c.step % self.keep_every_n_steps == 0:
                    reasons[c.step].append("keep_every_n_steps")
        reasons[by_step[-1].step].append("newest")
        resumable = [c for c in by_step if c.resumable]
        if resumable:
            reasons[resumable[-1].step].append("newest_resumable")
        for c in reversed(by_step):  # newest first: a base is always older than what lies over it
            if reasons[c.step] and c.base_step in reasons and "base_of_kept" not in reasons[c.base_step]:
                reasons[c.base_step].append("base_of_kept")
        return {step: tuple(names) for step, names in reasons.items()}
