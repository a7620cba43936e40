"""``python stalling_cli.py ARGS``: ``python -m recipes ARGS`` whose checkpoint save of one step hangs midway.

A save takes milliseconds, too short to kill a process inside it by timing alone. With
``RECIPES_TEST_STALL=POINT:STEP:MARKER`` in the environment, the save of step ``STEP`` stops
at ``POINT``, creates the file ``MARKER`` and sleeps, so that a test can ``kill -9`` the
process in exactly that state:

- ``mid_file``: part of ``model.pt`` is written to the save's temporary directory;
- ``before_rename``: every file and ``metadata.json`` are in the temporary directory, which is
  not yet renamed to ``step_N``;
- ``mid_prune``: the new checkpoint is committed, and an older one that the keep policy drops is
  marked as being removed and its ``metadata.json`` deleted, but not yet the rest of its directory.

The state on disk at each point is what the real code leaves there; only the pause is added.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from checkpoint import manager, serialization, store
from checkpoint.metadata import METADATA_FILE_NAME, CheckpointMetadata

STALL_SECONDS = 600.0


def stall(marker: Path) -> None:
    marker.write_text(str(os.getpid()))
    time.sleep(STALL_SECONDS)
    raise SystemExit("stalling_cli: the test did not kill this process")


def install(point: str, step: int, marker: Path) -> None:
    temp_dir_part = f"/step_{step}.tmp-"
    if point == "mid_file":
        write_torch_file = getattr(manager, "write_torch_file")  # noqa: B009  # Imported there, not exported.

        class StallingWriter(serialization._HashingWriter):
            def write(self, chunk: bytes | memoryview) -> int:
                written = super().write(chunk)
                if self.size > 4096:
                    self.flush()
                    stall(marker)
                return written

        def write_and_stall(fs: Any, path: str, state: Any) -> Any:
            if temp_dir_part in path and path.endswith("/model.pt"):
                serialization._HashingWriter = StallingWriter  # type: ignore[misc]
            return write_torch_file(fs, path, state)

        setattr(manager, "write_torch_file", write_and_stall)  # noqa: B010
    elif point == "before_rename":
        commit = store.CheckpointStore.commit

        def commit_or_stall(
            self: store.CheckpointStore, temp_dir: str, metadata: CheckpointMetadata, save_id: str
        ) -> None:
            if metadata.step == step:
                self.fs.pipe_file(f"{temp_dir}/{METADATA_FILE_NAME}", metadata.to_json().encode())
                stall(marker)
            commit(self, temp_dir, metadata, save_id)

        store.CheckpointStore.commit = commit_or_stall  # type: ignore[method-assign]
    elif point == "mid_prune":
        commit_and_prune = manager.CheckpointManager._commit_and_prune

        def remove_half(self: store.CheckpointStore, step_dir: str) -> None:
            self.begin_removal(step_dir)
            stall(marker)

        def commit_and_prune_stalling(self: manager.CheckpointManager, job: Any, records: Any) -> None:
            if job.step == step:
                store.CheckpointStore.remove = remove_half  # type: ignore[method-assign]
            commit_and_prune(self, job, records)

        manager.CheckpointManager._commit_and_prune = commit_and_prune_stalling  # type: ignore[method-assign]
    else:
        raise SystemExit(f"stalling_cli: unknown stall point {point!r}")


def main() -> int:
    setting = os.environ.get("RECIPES_TEST_STALL")
    if setting:
        point, step, marker = setting.split(":", 2)
        install(point, int(step), Path(marker))
    from recipes.cli.main import main as recipes_main

    return recipes_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
