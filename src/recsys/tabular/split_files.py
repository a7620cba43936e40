"""The files of a split as the user named them: messages about them name the split's config key
(``dataset.valid_path``), not a reader's parameter, and a scored split whose files hold no row stops the run at
start-up rather than at its first validation, after training."""

from __future__ import annotations

import glob
from typing import Any

from recipes import ConfigError, DataError
from recsys.data.stream import StreamingReader

SPLIT_PATH_KEYS = {"train": "dataset.train_path", "valid": "dataset.valid_path", "test": "dataset.test_path"}
"""The config key that names the files of each split a reader keeps."""


def paths_key(split: str) -> str:
    """The config key of ``split``'s files; the files of every split for ``all`` (a reader of histories)."""
    return SPLIT_PATH_KEYS.get(split, "dataset.train_path, valid_path and test_path")


def refuse_unlocated_paths(paths: dict[str, str | None], data_dir: str | None) -> None:
    """A relative local path (``{config key: path}``) that matches nothing in the current directory, with no
    ``dataset.data_dir`` set, is refused naming both keys: a preset that names its files (``ratings.dat``) leaves
    their folder to ``data_dir``."""
    if data_dir is not None:
        return
    for key, path in paths.items():
        if path and "://" not in path and not path.startswith(("/", "~")) and not glob.glob(path):
            raise ConfigError(
                f"`{key}` is {path!r}, relative to the current directory, which holds no such file: set "
                "`dataset.data_dir` to the folder that holds it, or give its full path."
            )


def refuse_rowless_split(reader: StreamingReader[Any], split: str, num_files: int, header_lines: int) -> None:
    """A scored split (``valid``, ``test``) whose files hold no record, a header alone (``header_lines``) or
    nothing, is refused: found at the first validation, it would end the run after training, without a checkpoint.
    Only the records count, not whether the split keeps them: a file sorted by time may begin with rows that a
    split by value gives to training (a split that keeps none of them is found at the first validation)."""
    if split not in ("valid", "test"):
        return
    for file_index in range(num_files):
        parsed = reader.first_records(file_index, 1)
        if parsed is not None and len(parsed.line_ends) > header_lines:
            return
    names = ", ".join(reader.file_name(file_index) for file_index in range(num_files))
    raise DataError(
        f"`{paths_key(split)}` must name data that holds rows, but {names} "
        f"{'holds' if num_files == 1 else 'hold'} none (a header alone, or nothing)."
    )
