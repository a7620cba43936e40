"""The checkpoints root on any fsspec file system, and the moves that make a checkpoint appear whole.

Layout under the root::

    step_N/                  a committed checkpoint: metadata.json + the files it lists
    step_N.tmp-<save id>/    a save in progress (or one that died): never loaded
    step_N.old-<save id>/    a checkpoint being replaced by a new save of the same step

A checkpoint is committed in one of two ways. On local disk the whole directory, metadata
included, is renamed from its temporary name, which POSIX makes atomic. Object stores and
``memory://`` have no atomic directory rename, so the data files are moved into ``step_N/``
first and ``metadata.json`` is written last: its presence is the commit.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import fsspec
from fsspec.implementations.local import LocalFileSystem

from checkpoint.errors import CheckpointError
from checkpoint.metadata import METADATA_FILE_NAME, CheckpointMetadata, FileRecord

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"step_(\d+)")
_UNFINISHED_DIR = re.compile(r"step_\d+\.(tmp|old)-[0-9a-f]+")


@dataclass(frozen=True)
class Leftover:
    """A directory under the root that is not a usable checkpoint, and why."""

    path: str
    reason: str


@dataclass(frozen=True)
class Scan:
    """What a listing of the root found: committed checkpoints by step, and leftovers to clean."""

    committed: Mapping[int, CheckpointMetadata]
    leftovers: Sequence[Leftover]


def basename(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


class CheckpointStore:
    """File-level access to a checkpoints root: naming, scanning, committing and removing directories."""

    def __init__(self, root: str) -> None:
        self.url = root
        self.fs, self.root = fsspec.core.url_to_fs(root)

    @property
    def has_atomic_rename(self) -> bool:
        return isinstance(self.fs, LocalFileSystem)

    def step_dir(self, step: int) -> str:
        return f"{self.root}/step_{step}"

    def temp_dir(self, step: int, save_id: str) -> str:
        return f"{self.root}/step_{step}.tmp-{save_id}"

    def scan(self) -> Scan:
        """List the root, checking each checkpoint's metadata and the sizes of the files it lists.

        Sizes catch a truncated or missing file cheaply; the full checksum is verified on load.
        """
        committed: dict[int, CheckpointMetadata] = {}
        leftovers: list[Leftover] = []
        if not self.fs.isdir(self.root):
            return Scan(committed, leftovers)
        for entry in self.fs.ls(self.root, detail=True):
            if entry["type"] != "directory":
                continue
            path = entry["name"].rstrip("/")
            name = basename(path)
            if _UNFINISHED_DIR.fullmatch(name):
                leftovers.append(Leftover(path, "an unfinished save"))
            elif match := _STEP_DIR.fullmatch(name):
                problem = self._check_step_dir(path, int(match.group(1)))
                if isinstance(problem, str):
                    leftovers.append(Leftover(path, problem))
                else:
                    committed[problem.step] = problem
        return Scan(dict(sorted(committed.items())), leftovers)

    def _check_step_dir(self, path: str, step: int) -> CheckpointMetadata | str:
        """The metadata of the checkpoint at ``path``, or why it is not a committed checkpoint."""
        try:
            entries = self.fs.ls(path, detail=True)
            sizes = {basename(e["name"]): e["size"] for e in entries if e["type"] == "file"}
            if METADATA_FILE_NAME not in sizes:
                return f"no {METADATA_FILE_NAME} (the save never committed)"
            metadata = self.read_metadata(path)
        except FileNotFoundError:
            return "it was deleted while being listed"  # By rank 0's pruning, seen from another rank.
        except CheckpointError as ex:
            return str(ex)
        if metadata.step != step:
            return f"its metadata is for step {metadata.step}"
        for file_name, record in metadata.files.items():
            if file_name not in sizes:
                return f"{file_name} is missing"
            if sizes[file_name] != record.size:
                return f"{file_name} is {sizes[file_name]} bytes instead of {record.size}"
        return metadata

    def read_metadata(self, step_dir: str) -> CheckpointMetadata:
        metadata_path = f"{step_dir}/{METADATA_FILE_NAME}"
        if not self.fs.exists(metadata_path):
            raise CheckpointError(f"`{step_dir}` must be a checkpoint directory, but has no {METADATA_FILE_NAME}.")
        text = self.fs.cat_file(metadata_path).decode("utf-8", errors="replace")
        return CheckpointMetadata.from_json(text, metadata_path)

    def commit(self, temp_dir: str, metadata: CheckpointMetadata, save_id: str) -> None:
        """Make the checkpoint written to ``temp_dir`` visible as ``step_N/``, replacing any older one."""
        final_dir = self.step_dir(metadata.step)
        replaced = f"{final_dir}.old-{save_id}"
        if self.fs.exists(final_dir):
            log.warning("Replacing the existing checkpoint %s with a new save of the same step.", final_dir)
            if self.has_atomic_rename:
                os.rename(final_dir, replaced)
            else:
                self.remove(final_dir)
        if self.has_atomic_rename:
            self.fs.pipe_file(f"{temp_dir}/{METADATA_FILE_NAME}", metadata.to_json().encode())
            os.rename(temp_dir, final_dir)
            if self.fs.exists(replaced):
                self.fs.rm(replaced, recursive=True)
        else:
            self.fs.makedirs(final_dir, exist_ok=True)
            for file_name in metadata.files:
                self.fs.mv(f"{temp_dir}/{file_name}", f"{final_dir}/{file_name}")
            self.fs.pipe_file(f"{final_dir}/{METADATA_FILE_NAME}", metadata.to_json().encode())
            self.fs.rm(temp_dir, recursive=True)

    def remove(self, step_dir: str) -> None:
        """Delete a checkpoint directory, its metadata first, so that a half-deleted one is never loaded."""
        metadata_path = f"{step_dir}/{METADATA_FILE_NAME}"
        if self.fs.exists(metadata_path):
            self.fs.rm(metadata_path)
        self.fs.rm(step_dir, recursive=True)

    def clean(self, leftovers: Sequence[Leftover], keep: Collection[str]) -> None:
        """Delete ``leftovers``, except the directories in ``keep`` (saves still in flight)."""
        for leftover in leftovers:
            if leftover.path in keep:
                continue
            log.warning("Removing %s under the checkpoints root: %s.", leftover.path, leftover.reason)
            self.fs.rm(leftover.path, recursive=True)

    def write_done_marker(self, temp_dir: str, rank: int, records: Mapping[str, FileRecord]) -> None:
        """Tell rank 0 that this rank's files of an asynchronous save are complete, and what they are."""
        document = {name: {"size": r.size, "sha256": r.sha256} for name, r in records.items()}
        self.fs.pipe_file(self._done_marker(temp_dir, rank), json.dumps(document).encode())

    def wait_for_done_markers(self, temp_dir: str, world_size: int, timeout_s: float) -> dict[str, FileRecord]:
        """Wait until every rank has written its done marker; return the records of all their files."""
        deadline = time.monotonic() + timeout_s
        waiting = set(range(world_size))
        while waiting:
            waiting = {rank for rank in waiting if not self.fs.exists(self._done_marker(temp_dir, rank))}
            if not waiting:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"Rank 0 waited {timeout_s:g} s for ranks {sorted(waiting)} to finish writing "
                    f"{temp_dir}; they may have died or their file system may be far behind."
                )
            time.sleep(0.05)
        records: dict[str, FileRecord] = {}
        for rank in range(world_size):
            marker = self._done_marker(temp_dir, rank)
            for name, record in json.loads(self.fs.cat_file(marker)).items():
                records[name] = FileRecord(size=int(record["size"]), sha256=str(record["sha256"]))
            self.fs.rm(marker)
        return records

    @staticmethod
    def _done_marker(temp_dir: str, rank: int) -> str:
        return f"{temp_dir}/rank_{rank}.done.json"
