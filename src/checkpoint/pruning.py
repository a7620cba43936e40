"""Deleting the checkpoints a run's keep policy no longer keeps, except those a reader holds (``checkpoint.reading``)
and the bases those lie over (a delta checkpoint is read with its base).

A prune never waits for a reader: it leaves the checkpoint being read for a later one. The manager
prunes after every save, and once more when it closes, so that the run's last save is not the last
chance of a checkpoint that was being read then.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from checkpoint.metadata import CheckpointMetadata
from checkpoint.policy import CheckpointPolicy
from checkpoint.reading import unread
from checkpoint.store import CheckpointStore

log = logging.getLogger(__name__)


class Pruner:
    """Rank 0's deletions of the checkpoints under ``store`` that ``policy`` no longer keeps."""

    def __init__(self, store: CheckpointStore, policy: CheckpointPolicy) -> None:
        self._store = store
        self._policy = policy
        self.kept_while_read: set[int] = set()
        """The steps the last prune left because a reader held them."""

    def prune(self, committed: Mapping[int, CheckpointMetadata], *, last: bool = False) -> None:
        """Delete what the policy does not keep of ``committed``; ``last``: the run's last prune, so a checkpoint
        still read then stays beyond the policy, which is said as a warning."""
        self.kept_while_read.clear()
        needed: set[int] = set()  # the bases of the checkpoints kept while read
        reasons_by_step = self._policy.reasons_to_keep(list(committed.values()))
        for step, reasons in sorted(reasons_by_step.items(), reverse=True):  # what lies over a base comes first
            if reasons:
                continue
            if step in needed:  # the base of a checkpoint being read
                self.kept_while_read.add(step)
                self._add_base(needed, committed[step])
                continue
            with unread(self._store, self._store.step_dir(step)) as free:
                if free:
                    log.info("Deleting the checkpoint of step %d, which no policy keeps.", step)
                    self._store.remove(self._store.step_dir(step))
                    continue
            self.kept_while_read.add(step)
            self._add_base(needed, committed[step])
            if last:
                log.warning(
                    "Keeping the checkpoint of step %d, which no policy keeps, as it is still read when the run "
                    "ends: the next save into %s deletes it.",
                    step,
                    self._store.url,
                )
            else:
                log.info("Keeping the checkpoint of step %d, which no policy keeps, while it is read.", step)

    @staticmethod
    def _add_base(needed: set[int], metadata: CheckpointMetadata) -> None:
        if metadata.base_step is not None:
            needed.add(metadata.base_step)
