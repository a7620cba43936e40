"""``python -m recipes export-tables``: a checkpoint's sparse tables as Parquet files of ``(id, embedding)``.

The tables are read from the rank files of the checkpoint, not from a built model: a table's
rows are spread over the ranks that saved it (row ranges of a fixed table, ids hashed to ranks
for a hash table), and the pieces say which ids their rows belong to (see ``embedding.state``
and ``embedding.dynamic_state``). So a checkpoint of any number of ranks exports in one process,
without torch.distributed, the recipe's data or its model. Each rank file is read once and only
its rows are kept (its optimizer state is dropped at once), so the peak memory is the tables'
rows plus one rank file.

``DIR/<table>.parquet`` has the columns ``id`` (int64) and ``embedding``
(``fixed_size_list<float32>[dim]``), sorted by id. A fixed table's ids are its rows
``0..num_rows-1``; a hash table's are the ids that hold a row, every other id being looked up
as the table's default row of zeros. ``DIR`` appears whole or not at all: the files are written
into a temporary folder beside it, renamed last.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import fsspec
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pa_parquet
import torch

from checkpoint import LoadedCheckpoint
from embedding import DELTA_KEY, ShardedStateError, initial_rows, saved_rows_in_range
from recipes.checkpointing import deltas
from recipes.cli.job import checkpoint_step, read_only_checkpoints
from recipes.errors import UserError


@dataclass(frozen=True)
class ExportedTable:
    """One file written: the table's name, its rows (ids) and dim, and where it is."""

    name: str
    num_rows: int
    dim: int
    path: str


@dataclass
class TableRows:
    """The rows of one table gathered from the pieces of every rank (``export`` reads them too)."""

    kind: str
    dim: int
    fixed_rows: npt.NDArray[np.float32] | None = None
    covered: npt.NDArray[np.bool_] | None = None
    hash_ranks: set[int] = field(default_factory=set)
    hash_keys: list[npt.NDArray[np.int64]] = field(default_factory=list)
    hash_rows: list[npt.NDArray[np.float32]] = field(default_factory=list)
    base_step: int | None = None
    """The step of the checkpoint its pieces were deltas over, if they were (``embedding.row_changes``)."""
    changed_ids: list[npt.NDArray[np.int64]] | None = field(default_factory=list)
    """With ``base_step``, the ids the deltas list as changed since it (every other id's row is the base's);
    ``None`` where a piece was whole."""


def export_tables(output_dir: str, which: str, destination: str) -> list[ExportedTable]:
    """Write every sparse table of the run's checkpoint ``which`` (``last``, ``best``, ``N`` or ``step_N``)
    to ``destination/<table>.parquet``; returns what was written, in table order.

    :raises UserError: if ``output_dir`` is no run, holds no such checkpoint or no sparse table, or
        ``destination`` exists and is not an empty folder.
    """
    manager = read_only_checkpoints(output_dir)
    fs, target = open_destination(destination)
    if not manager.list_checkpoints():
        raise UserError(f"{output_dir} holds no checkpoint to export tables from.")
    choose = partial(checkpoint_step, manager, step_number(which), output_dir)
    choose()  # Checked before any work; chosen again when it is read.
    temp = make_temp_folder(fs, target, destination)
    try:
        step, tables = manager.read(choose, lambda step: (step, gather_tables(manager.load(step, keys=[]))))
        if not tables:
            raise UserError(f"The checkpoint of step {step} in {output_dir} holds no sparse table to export.")
        written = _write_tables(fs, temp, destination, tables)
        if fs.exists(target):
            fs.rmdir(target)  # empty, as checked (else this fails): a rename onto a folder would move into it
        fs.mv(temp, target, recursive=True)
    finally:
        if fs.exists(temp):
            fs.rm(temp, recursive=True)
    return written


def step_number(which: str) -> str:
    """``step_N`` (the checkpoint folder's name) as ``eval`` names a step, ``N``; anything else unchanged."""
    number = which.removeprefix("step_")
    return number if which.startswith("step_") and number.isdigit() else which


def open_destination(destination: str) -> tuple[Any, str]:
    """The filesystem and path of ``destination``, a new or empty folder (``check_destination``)."""
    fs, target = fsspec.core.url_to_fs(destination)
    target = target.rstrip("/")
    check_destination(fs, target, destination)
    return fs, target


def check_destination(fs: Any, target: str, destination: str) -> None:
    """Refuse a destination that holds anything: exporting must never mix with or replace a user's files."""
    if not fs.exists(target):
        return
    if not fs.isdir(target):
        raise UserError(f"`-o` must be a new or empty folder, but {destination} is a file.")
    if fs.ls(target, detail=False):
        raise UserError(f"`-o` must be a new or empty folder, but {destination} is not empty.")


def make_temp_folder(fs: Any, target: str, destination: str) -> str:
    """The folder beside ``target`` that the files go to first, made before any work so that a destination
    that cannot be written is a user error then, not a failure after reading every rank's file."""
    parent, base = os.path.split(target)
    temp = f"{parent}/.{base}.tmp-{os.getpid()}" if parent else f".{base}.tmp-{os.getpid()}"
    try:
        fs.makedirs(temp, exist_ok=True)
    except OSError as ex:
        raise UserError(f"`-o` must be a folder that can be written, but {destination} cannot be: {ex}") from None
    return temp


def gather_tables(loaded: LoadedCheckpoint) -> dict[tuple[str, str], TableRows]:
    """Every table of every sharded state, by ``(sharded state name, table name)``, in the order saved."""
    tables: dict[tuple[str, str], TableRows] = {}
    for old_rank in range(loaded.num_ranks):
        rank_state = loaded.load_rank_state(old_rank)
        changed = _changed_ids(rank_state)
        rank_state = deltas.merged(loaded, old_rank, rank_state)
        for state_name, pieces in _table_pieces(rank_state).items():
            for table_name, piece in pieces.items():
                key = (state_name, table_name)
                _add_piece(tables, key, piece)
                _add_changed(tables[key], loaded.metadata.base_step, changed.get(key))
        del rank_state  # Only the rows were kept; the rank's optimizer state goes now.
    return tables


def _table_pieces(rank_state: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The table pieces of each sharded state (not those of a recipe's own kind of sharded state)."""
    found = {}
    for state_name, state in (rank_state.get("sharded") or {}).items():
        pieces = state.get("tables") if isinstance(state, Mapping) else None
        if isinstance(pieces, Mapping):
            found[state_name] = pieces
    return found


def _changed_ids(rank_state: Mapping[str, Any]) -> dict[tuple[str, str], npt.NDArray[np.int64] | None]:
    """The ids each table's delta piece lists (a fixed table's rows, a hash table's changed ids); None: whole."""
    changed: dict[tuple[str, str], npt.NDArray[np.int64] | None] = {}
    for state_name, pieces in _table_pieces(rank_state).items():
        for table_name, piece in pieces.items():
            ids = None
            if DELTA_KEY in piece:
                ids = piece["index"]["keys"][piece["changed"]] if piece.get("kind") == "hash" else piece["row_ids"]
            changed[(state_name, table_name)] = None if ids is None else ids.numpy().astype(np.int64, copy=False)
    return changed


def _add_changed(table: TableRows, base_step: int | None, ids: npt.NDArray[np.int64] | None) -> None:
    table.base_step = base_step
    if table.changed_ids is not None:
        table.changed_ids = None if ids is None or base_step is None else [*table.changed_ids, ids]


def _add_piece(tables: dict[tuple[str, str], TableRows], key: tuple[str, str], piece: Mapping[str, Any]) -> None:
    """Keep the rows of ``piece``: each row once, as replicas (a replicated table, or the ranks of a
    tensor-parallel group, which hold the same tables) hold the same rows."""
    weight = piece["weight"]
    kind = "hash" if piece.get("kind") == "hash" else "fixed"
    table = tables.setdefault(key, TableRows(kind, int(weight.size(1))))
    if table.kind != kind or table.dim != int(weight.size(1)):
        raise ShardedStateError(
            f"The ranks of the checkpoint must hold table '{key[1]}' with one kind and dim, but hold a "
            f"{table.kind} table of dim {table.dim} and a {kind} one of dim {int(weight.size(1))}."
        )
    if kind == "hash":
        if int(piece["rank"]) in table.hash_ranks:
            return
        table.hash_ranks.add(int(piece["rank"]))
        table.hash_keys.append(piece["index"]["keys"].numpy().astype(np.int64, copy=False))
        table.hash_rows.append(_rows(weight))
        return
    if table.fixed_rows is None or table.covered is None:
        table.fixed_rows = np.zeros((int(piece["num_rows"]), table.dim), dtype=np.float32)
        table.covered = np.zeros(int(piece["num_rows"]), dtype=np.bool_)
    start, end = int(piece["row_start"]), int(piece["row_end"])
    if end > start and not table.covered[start:end].all():
        if "row_ids" in piece:  # a table stored off the device: the rows no step wrote are at their initial values
            table.fixed_rows[start:end] = _rows(initial_rows(piece, key[1], start, end))
            rows, index = saved_rows_in_range(piece, start, end)
            table.fixed_rows[rows.numpy()] = _rows(weight[index])
        else:
            table.fixed_rows[start:end] = _rows(weight)
        table.covered[start:end] = True


def _rows(weight: torch.Tensor) -> npt.NDArray[np.float32]:
    return weight.detach().to("cpu", torch.float32).numpy()


def ids_and_rows(name: str, table: TableRows) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    """The table's ids, sorted, and their rows."""
    if table.kind == "hash":
        keys = np.concatenate(table.hash_keys)
        rows = np.concatenate(table.hash_rows)
        ids, first = np.unique(keys, return_index=True)  # sorted; ranks hold disjoint ids
        return ids.astype(np.int64), rows[first]
    assert table.fixed_rows is not None and table.covered is not None
    if not table.covered.all():
        missing = int(np.flatnonzero(~table.covered)[0])
        raise ShardedStateError(
            f"The checkpoint's ranks must hold every row of table '{name}', but hold no row {missing}."
        )
    return np.arange(len(table.fixed_rows), dtype=np.int64), table.fixed_rows


def file_names(tables: Mapping[tuple[str, str], TableRows]) -> dict[tuple[str, str], str]:
    """``<table>``, or ``<sharded state>.<table>`` where two sharded states hold tables of one name."""
    counts: dict[str, int] = {}
    for _, table_name in tables:
        counts[table_name] = counts.get(table_name, 0) + 1
    return {(state, name): name if counts[name] == 1 else f"{state}.{name}" for state, name in tables}


def _write_tables(
    fs: Any, folder: str, destination: str, tables: Mapping[tuple[str, str], TableRows]
) -> list[ExportedTable]:
    """Write every table to ``folder``; the paths returned are those the files will have in ``destination``."""
    names = file_names(tables)
    written: list[ExportedTable] = []
    for key, table in tables.items():
        ids, rows = ids_and_rows(names[key], table)
        write_rows(fs, f"{folder}/{names[key]}.parquet", ids, rows, table.dim)
        written.append(
            ExportedTable(names[key], len(ids), table.dim, f"{destination.rstrip('/')}/{names[key]}.parquet")
        )
    return written


def write_rows(fs: Any, path: str, ids: npt.NDArray[np.int64], rows: npt.NDArray[np.float32] | None, dim: int) -> None:
    """``(id, embedding)`` Parquet, or ``id`` alone without ``rows`` (the ids a delta export evicts)."""
    columns: dict[str, pa.Array] = {"id": pa.array(ids, pa.int64())}
    if rows is not None:
        values = pa.array(np.ascontiguousarray(rows, dtype=np.float32).reshape(-1), pa.float32())
        columns["embedding"] = pa.FixedSizeListArray.from_arrays(values, dim)
    with fs.open(path, "wb") as file:
        pa_parquet.write_table(pa.table(columns), file)
