"""What a committed checkpoint is made of: its file names, the view a load returns, and its row in a listing.

Apart from the manager so that code that only reads checkpoints (tests, tools) needs none of the
saving machinery.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from checkpoint.errors import CheckpointError, CorruptCheckpointError
from checkpoint.metadata import CheckpointMetadata
from checkpoint.serialization import read_torch_file
from checkpoint.store import CheckpointStore

RANK_FILE_NAME = re.compile(r"rank_\d+\.pt")


def rank_file_name(rank: int) -> str:
    return f"rank_{rank}.pt"


def shared_file_name(key: str) -> str:
    """The file holding ``{key: shared_state[key]}``."""
    return f"{key}.pt"


def shared_keys(metadata: CheckpointMetadata) -> list[str]:
    """The top-level keys of a checkpoint's shared state, one per file."""
    return [name.removesuffix(".pt") for name in metadata.files if not RANK_FILE_NAME.fullmatch(name)]


@dataclass(frozen=True)
class CheckpointInfo:
    """One checkpoint, committed or damaged, as ``python -m recipes checkpoints`` shows it."""

    step: int
    path: str
    score: float | None
    size_bytes: int
    resumable: bool
    kept_by: tuple[str, ...]
    """The policy rules that keep this checkpoint at the next prune."""
    is_best: bool
    damage: str | None = None
    """Why a damaged checkpoint is never used (``path`` says whether it is moved aside yet); None if intact."""


class LoadedCheckpoint:
    """A verified checkpoint: its metadata, the shared state (all its files), and each old rank's state on demand.

    The run that saved it may have had another number of ranks than the one loading it, so any
    rank can read any old rank's state. ``base`` is the checkpoint its rank files lie over (its
    ``metadata.base_step``; without shared state), whose rank files a reader merges them with.
    """

    def __init__(
        self,
        store: CheckpointStore,
        metadata: CheckpointMetadata,
        shared_state: dict[str, Any],
        base: LoadedCheckpoint | None = None,
    ) -> None:
        self._store = store
        self.metadata = metadata
        self.shared_state = shared_state
        self.base = base
        self._verified: dict[int, dict[str, Any]] = {}

    @property
    def step(self) -> int:
        return self.metadata.step

    @property
    def num_ranks(self) -> int:
        """How many ranks saved this checkpoint; ``load_rank_state`` reads any of theirs."""
        return self.metadata.world_size

    def load_rank_state(self, old_rank: int) -> dict[str, Any]:
        if not 0 <= old_rank < self.num_ranks:
            raise CheckpointError(
                f"`old_rank` must be in [0, {self.num_ranks}) for the checkpoint of step {self.step}, "
                f"but is {old_rank} instead."
            )
        if old_rank in self._verified:
            return self._verified.pop(old_rank)  # Handed over once: the caller holds it from here on.
        return read_file(self._store, self.metadata, rank_file_name(old_rank))

    def verify_rank_files(self, old_ranks: Iterable[int]) -> None:
        """Read and check these old ranks' files now, keeping what they hold for ``load_rank_state``.

        Reading a file is how its checksum is checked, and a resume reads it right after, so
        the state is kept rather than read twice. The base's files are checked too.
        """
        old_ranks = list(old_ranks)
        for old_rank in old_ranks:
            self._verified[old_rank] = self.load_rank_state(old_rank)
        if self.base is not None:
            self.base.verify_rank_files(old_ranks)


def read_file(store: CheckpointStore, metadata: CheckpointMetadata, file_name: str) -> dict[str, Any]:
    step_dir = store.step_dir(metadata.step)
    record = metadata.files.get(file_name)
    if record is None:
        raise CorruptCheckpointError(
            f"The checkpoint of step {metadata.step} in {step_dir} must list {file_name}, but does not."
        )
    return read_torch_file(store.fs, f"{step_dir}/{file_name}", record)


def base_of(
    store: CheckpointStore, metadata: CheckpointMetadata, committed: Mapping[int, CheckpointMetadata]
) -> LoadedCheckpoint | None:
    """The checkpoint that ``metadata``'s rank files lie over (without its shared state), to read them by; one that
    is not there damages the checkpoint of ``metadata``."""
    if metadata.base_step is None:
        return None
    base = committed.get(metadata.base_step)
    if base is None:
        raise CorruptCheckpointError(
            f"The checkpoint of step {metadata.step} in {store.step_dir(metadata.step)} must have its base, the "
            f"checkpoint of step {metadata.base_step}, but it is not there."
        )
    return LoadedCheckpoint(store, base, {}, base_of(store, base, committed))
