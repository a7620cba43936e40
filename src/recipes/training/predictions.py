"""Predictions as a table: one row per input example, in input order, written as CSV or Parquet.

Readers deal the rows of each step to the data-parallel ranks round-robin (row ``i`` of a step to
rank ``i % dp_size``, as the ``DataReader`` contract says), so the ranks' outputs of a step interleave
back into input order. pyarrow writes the file through fsspec, under a temporary name renamed
last, so a file at the given path is always whole.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import fsspec
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pa_parquet
import torch
from fsspec.implementations.local import LocalFileSystem

from gang import Gang
from recipes.errors import UserError

FORMATS = {".csv": "csv", ".parquet": "parquet"}

Columns = dict[str, npt.NDArray[np.generic]]


class PredictionCollector:
    """This rank's predictions, step by step, until ``gather`` puts every rank's in input order."""

    def __init__(self) -> None:
        self._steps: list[Columns] = []

    def add_step(self, outputs: Sequence[Mapping[str, torch.Tensor]]) -> None:
        """The outputs of one step's micro-batches, each one column per name and one row per example."""
        names = list(outputs[0]) if outputs else []
        self._steps.append(
            {name: torch.cat([o[name].detach().reshape(-1) for o in outputs]).cpu().numpy() for name in names}
        )

    def gather(self, gang: Gang) -> Columns | None:
        """Every rank's rows in input order, on rank 0 of ``gang`` (``None`` on the others)."""
        per_rank = gang.all_gather_object(self._steps)
        if gang.rank != 0:
            return None
        steps = [_interleave([rank_steps[i] for rank_steps in per_rank]) for i in range(len(self._steps))]
        names = list(steps[0]) if steps else []
        return {name: np.concatenate([step[name] for step in steps]) for name in names}


def _interleave(parts: list[Columns]) -> Columns:
    sizes = [len(next(iter(part.values()))) if part else 0 for part in parts]
    total, num_ranks = sum(sizes), len(parts)
    expected = [len(range(rank, total, num_ranks)) for rank in range(num_ranks)]
    if sizes != expected:
        raise RuntimeError(
            f"A step's rows must be dealt to the ranks round-robin (row i to rank i % {num_ranks}), so its ranks "
            f"must hold {expected} rows, but hold {sizes} instead: the reader breaks the contract of "
            "recipes.DataReader, and predictions could not be put back in input order."
        )
    names = next((list(part) for part in parts if part), [])
    columns: Columns = {}
    for name in names:
        column = np.empty(total, dtype=next(part[name].dtype for part in parts if part))
        for rank, part in enumerate(parts):
            if part:
                column[rank::num_ranks] = part[name]
        columns[name] = column
    return columns


def check_writable(path: str, output_dir: str) -> None:
    """Fail before any work if ``path`` is not a ``.csv``/``.parquet`` file that can be written: in a folder that
    exists (a misspelt folder is not made), and not among the checkpoints of the run in ``output_dir``, which
    training deletes when it prunes them."""
    _format_of(path)
    checkpoints = _local_or_url(f"{output_dir}/checkpoints")
    if _local_or_url(path).startswith(f"{checkpoints}/"):
        raise UserError(
            f"`-o` must be a file outside the run's checkpoints, which training deletes when it prunes them, "
            f"but {path} is in {output_dir}/checkpoints."
        )
    fs, fs_path = fsspec.core.url_to_fs(path)
    try:
        if fs.isdir(fs_path):
            raise UserError(f"`-o` must name a file, but {path} is a directory.")
        parent = os.path.dirname(fs_path)
        if parent and isinstance(fs, LocalFileSystem) and not fs.exists(parent):
            raise UserError(f"`-o` must be a file in a folder that exists, but {os.path.dirname(path)} does not exist.")
        probe = f"{fs_path}.tmp-{os.getpid()}"
        with fs.open(probe, "wb"):
            pass
        fs.rm(probe)
    except OSError as ex:
        raise UserError(f"`-o` must be a writable file, but {path} cannot be written: {ex}") from None


def refuse_overwriting_inputs(path: str, config: Any) -> None:
    """Fail if ``path`` is a file the run's config names (its test data, say): writing there would replace it."""
    target = _local_or_url(path)
    for key, value in _config_strings(
        dataclasses.asdict(config) if dataclasses.is_dataclass(config) and not isinstance(config, type) else config
    ):
        if _local_or_url(value) == target:
            raise UserError(f"`-o` must not name a file the run reads, but {path} is its `{key}`.")


def _config_strings(node: Any, prefix: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(node, Mapping):
        for key, value in node.items():
            yield from _config_strings(value, f"{prefix}{key}.")
    elif isinstance(node, list | tuple):
        for index, value in enumerate(node):
            yield from _config_strings(value, f"{prefix}{index}.")
    elif isinstance(node, str) and node:
        yield prefix.rstrip("."), node


def _local_or_url(path: str) -> str:
    """A path as one string per file: local paths absolute and normalised, URLs as given."""
    if path.startswith("file://"):
        path = path[len("file://") :]
    return path if "://" in path else os.path.realpath(path)


def write_predictions(path: str, columns: Mapping[str, npt.NDArray[np.generic]]) -> None:
    """Write ``columns`` to ``path`` (CSV or Parquet by its extension), whole or not at all."""
    table = pa.table(dict(columns))
    fs, fs_path = fsspec.core.url_to_fs(path)
    tmp = f"{fs_path}.tmp-{os.getpid()}"
    with fs.open(tmp, "wb") as file:
        if _format_of(path) == "parquet":
            pa_parquet.write_table(table, file)
        else:
            pa_csv.write_csv(table, file)
    fs.mv(tmp, fs_path)


def _format_of(path: str) -> str:
    extension = os.path.splitext(path)[1].lower()
    if extension not in FORMATS:
        raise UserError(f"`-o` must end in {' or '.join(FORMATS)}, but is {path} instead.")
    return FORMATS[extension]
