"""``python -m recipes export``: a checkpoint as a folder that a serving system loads without this project.

What a serving system needs is the model cut where lookups end: the tables (which it keeps in a
store of its own) and the dense part, a program over pooled vectors. The model says where the cut
is (``recipes.serving.servable.ServableModel``); the dense part is traced by ``torch.export`` into a
program any torch loads without our code (a TorchFX graph where ``torch.export`` cannot trace), and
the tables are read from the checkpoint's rank files as ``export-tables`` reads them (one code
path: ``recipes.cli.export_tables``), so a run of any number of ranks exports in one process.

``DIR``::

    model.json            format, step, since, num_dense, the pooled inputs in the program's order
                          (feature -> table, dim, pooling), the tables (file, dim, kind, rows); for a
                          model of several outputs, their names in the order of the scores' columns; for a
                          model that reads sequences in order, those (feature, table, dim, max_len)
    config.json           the run's resolved config: the data schema (its columns, encodings) among it
    dense.pt2             the dense part: ``torch.export.load(...).module()(dense [B, D], [pooled [B, dim]...])``
                          gives the scores [B], or [B, outputs] (or dense_fx.pt, a pickled ``torch.fx.GraphModule``);
                          with sequences, ``(dense, pooled, [rows [B, max_len, dim]...], [lengths [B]...])``
    tables/<table>.parquet          (id int64, embedding fixed_size_list<float32>[dim]), sorted by id; with
                                    ``--dtype int8|int4``, (id, codes, scale, bias): ``recipes.serving.quantized``
    tables/<table>.evicted.parquet  (id) with ``--since``: the ids the table no longer holds
    tables/<table>.values.parquet   (id, feature, value) the texts behind the ids, where the recipe names them
                                    (``RecipeParts.value_texts``); whole, with ``--since`` too
    items.parquet         (id, embedding) for a retrieval model: every item's vector by its item tower; the
                          texts of its ids in its table's values file (``items.values``)

With ``--since STEP`` the tables hold only the rows that changed after checkpoint ``STEP`` (new ids,
and ids whose row differs at all), and the ids dropped since (evicted from a hash table): applied over
an export of ``STEP`` (rows replaced by id, evicted ids removed) they give the tables of a full export.
The dense part is small and written whole either way. No optimizer state is read into the export.

With ``--dtype int8`` or ``int4`` each table's rows are quantised row-wise as FBGEMM serves them (codes, an fp16
scale and bias a row: ``recipes.serving.quantized``); ``model.json`` says each table's ``dtype`` and
``row_bytes`` (its fused row: codes, scale, bias). A delta compares the float32 rows, then quantises the changed.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pa_parquet
import torch
import yaml
from torch import nn

from checkpoint import CheckpointManager
from recipes.cli.export_tables import (
    TableRows,
    file_names,
    gather_tables,
    ids_and_rows,
    make_temp_folder,
    open_destination,
    step_number,
    write_rows,
)
from recipes.cli.job import checkpoint_step, read_only_checkpoints
from recipes.cli.job_spec import JobSpec
from recipes.cli.scoring import loaded_checkpoint
from recipes.errors import UserError
from recipes.serving.quantized import BITS, code_bytes, quantize
from recipes.serving.servable import DenseForServing, ServableModel

EXPORT_FORMAT = 1
"""The version of the folder's layout, in ``model.json``: a serving system checks it before reading the rest."""


@dataclass(frozen=True)
class ExportSummary:
    """What ``export`` wrote: the step, the one its deltas are since, the dense program's file, rows and evictions
    per table, the tables' dtype, and the folder's bytes."""

    step: int
    since: int | None
    program: str
    rows: dict[str, int]
    evicted: dict[str, int]
    values: dict[str, int]
    """Per table with a values file, the ids it names."""
    num_bytes: int
    dtype: str = "float32"


def export(
    output_dir: str,
    which: str,
    destination: str,
    since: str | None = None,
    *,
    values: bool = True,
    dtype: str = "float32",
) -> ExportSummary:
    """Export checkpoint ``which`` (``auto``, ``last``, ``best`` or a step) of the run in ``output_dir`` to the new
    folder ``destination``; with ``since`` (a step), only what changed after that checkpoint; with ``values``, the
    texts behind the ids where the recipe names them; the tables' rows as ``dtype`` (``float32``, or ``int8`` or
    ``int4`` quantised row-wise).

    :raises UserError: if ``dtype`` is none of those, ``output_dir`` is no run, the checkpoints are not there,
        ``destination`` is not a new or empty folder, or the model cannot be split into lookups and a dense part.
    """
    if dtype != "float32" and dtype not in BITS:
        raise UserError(f"`--dtype` must be float32, {' or '.join(BITS)}, but is {dtype} instead.")
    config_path = f"{output_dir}/config.yaml"
    if not os.path.isfile(config_path):
        raise UserError(f"OUTPUT_DIR must be a run's output directory, but {output_dir} has no config.yaml.")
    fs, target = open_destination(destination)
    manager = read_only_checkpoints(output_dir)
    choose = partial(checkpoint_step, manager, step_number(which), output_dir)
    step = choose()  # Checked before any work; chosen again when it is read.
    if since is not None:
        _since_step(manager, since, step, output_dir)
    temp = make_temp_folder(fs, target, destination)
    try:
        read = manager.read(choose, partial(_read_checkpoints, manager, output_dir, since, values, fs, temp))
        names = _table_files(read.tables, read.split)
        rows, evicted = _write_tables(fs, temp, read.tables, names, read.old_tables, read.since_step, dtype)
        value_files, value_ids = _write_values(fs, temp, read.split, read.texts)
        model = _model_json(read, names, rows, value_files, dtype)
        if read.split.items is not None:
            items = _write_item_vectors(fs, temp, read.split, read.tables, names)
            model["items"] = items | {"values": value_files.get(items["table"])}
        _write_json(fs, f"{temp}/model.json", model)
        with open(config_path) as file:
            _write_json(fs, f"{temp}/config.json", yaml.safe_load(file))
        num_bytes = sum(int(info["size"]) for info in fs.find(temp, detail=True).values())
        if fs.exists(target):
            fs.rmdir(target)  # empty, as checked (else this fails): a rename onto a folder would move into it
        fs.mv(temp, target, recursive=True)
    finally:
        if fs.exists(temp):
            fs.rm(temp, recursive=True)
    return ExportSummary(read.step, read.since_step, read.program, rows, evicted, value_ids, num_bytes, dtype)


@dataclass
class _ReadOut:
    """What ``export`` reads of the run's checkpoints, while it holds them: the dense program is written then."""

    step: int
    since_step: int | None
    program: str
    split: DenseForServing
    texts: Mapping[str, pa.Table]
    tables: dict[tuple[str, str], TableRows]
    old_tables: dict[tuple[str, str], TableRows] | None


def _read_checkpoints(
    manager: CheckpointManager, output_dir: str, since: str | None, values: bool, fs: Any, temp: str, step: int
) -> _ReadOut:
    """Read the checkpoint of ``step`` (and of ``--since``, held too) and write its dense program to ``temp``."""
    spec = JobSpec(f"{output_dir}/config.yaml", output_dir)
    with loaded_checkpoint(spec, str(step), "valid", one_unit=True) as loaded:
        parts = loaded.built.parts
        split = _dense_for_serving(parts.train_unit.model)
        program = _write_program(fs, temp, split)
        texts = parts.value_texts() if values and parts.value_texts is not None else {}
    tables = _tables(manager, step)
    if since is None:
        return _ReadOut(step, None, program, split, texts, tables, None)
    choose_since = partial(_since_step, manager, since, step, output_dir)
    since_step, old = manager.read(choose_since, lambda found: (found, _tables(manager, found)))
    return _ReadOut(step, since_step, program, split, texts, tables, old)


def _tables(manager: CheckpointManager, step: int) -> dict[tuple[str, str], TableRows]:
    return gather_tables(manager.load(step, keys=[]))


def _since_step(manager: CheckpointManager, since: str, step: int, output_dir: str) -> int:
    """The step ``--since`` names: a checkpoint still there, before the exported one."""
    steps = [info.step for info in manager.list_checkpoints()]
    number = step_number(since)
    if not number.isdigit() or int(number) not in steps:
        raise UserError(
            f"`--since` must name a checkpoint of {output_dir} (steps {steps}), but step {since} is gone or never was."
        )
    if int(number) >= step:
        raise UserError(f"`--since` must name a step before the exported {step}, but is {number}.")
    return int(number)


def _dense_for_serving(model: nn.Module) -> DenseForServing:
    """The model's dense part, or a one-line refusal saying what the model lacks."""
    if not isinstance(model, ServableModel):
        raise UserError(
            f"The model must split into sparse lookups and a dense part to be exported, but "
            f"{type(model).__name__} does not: it needs a `dense_for_serving()` method returning "
            "`recipes.DenseForServing` (the dense part over pooled embeddings and dense features)."
        )
    return model.dense_for_serving()


def _example_inputs(split: DenseForServing, batch_size: int) -> tuple[Any, ...]:
    """Inputs of the program's signature, on the CPU: ``(dense, pooled)``, and ``(sequences, lengths)`` after them
    for a model that takes sequences (lengths from 0 to ``max_len``, so that no length is special-cased)."""
    dense = torch.randn(batch_size, split.num_dense)
    pooled = [torch.randn(batch_size, pooled.dim) for pooled in split.inputs]
    if not split.sequences:
        return dense, pooled
    sequences = [torch.randn(batch_size, sequence.max_len, sequence.dim) for sequence in split.sequences]
    lengths = [torch.arange(batch_size) % (sequence.max_len + 1) for sequence in split.sequences]
    return dense, pooled, sequences, lengths


def _write_program(fs: Any, folder: str, split: DenseForServing) -> str:
    """``dense.pt2`` by ``torch.export`` with a dynamic batch size, on the CPU; else ``dense_fx.pt`` by TorchFX."""
    module = split.module.eval()
    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    module.to("cpu")
    try:
        inputs = _example_inputs(split, 4)
        batch = torch.export.Dim("batch", min=1)
        shapes = ({0: batch}, *([{0: batch} for _ in group] for group in inputs[1:]))
        try:
            with torch.no_grad():
                program = torch.export.export(module, inputs, dynamic_shapes=shapes, strict=False)
        except Exception:
            graph = torch.fx.symbolic_trace(module)
            with fs.open(f"{folder}/dense_fx.pt", "wb") as file:
                torch.save(graph, file)
            return "dense_fx.pt"
        with fs.open(f"{folder}/dense.pt2", "wb") as file:
            torch.export.save(program, file)
        return "dense.pt2"
    finally:
        module.to(device)


def _table_files(tables: dict[tuple[str, str], TableRows], split: DenseForServing) -> dict[str, tuple[str, str]]:
    """Each exported table's file name -> its key; every table the dense part's inputs look up must be there."""
    by_file = {name: key for key, name in file_names(tables).items()}
    for pooled in split.lookups():
        if pooled.table not in by_file:
            raise UserError(
                f"Table '{pooled.table}' (feature '{pooled.feature}') must be a sparse table of the checkpoint to be "
                f"exported, but the checkpoint holds only {sorted(by_file)}: dense embedding bags are model "
                "parameters, not tables a serving store can hold."
            )
    return by_file


def _write_tables(
    fs: Any,
    folder: str,
    tables: dict[tuple[str, str], TableRows],
    names: dict[str, tuple[str, str]],
    old: dict[tuple[str, str], TableRows] | None,
    since: int | None,
    dtype: str,
) -> tuple[dict[str, int], dict[str, int]]:
    """``tables/<name>.parquet`` each, its rows as ``dtype`` (the changed rows only, and ``.evicted.parquet``,
    against ``old``, the tables of the checkpoint of step ``since``)."""
    fs.makedirs(f"{folder}/tables", exist_ok=True)
    rows_written, evicted_written = {}, {}
    for name, key in names.items():
        ids, rows = ids_and_rows(name, tables[key])
        dim = tables[key].dim
        if old is not None:
            previous = old.get(key)
            old_ids, old_rows = ids_and_rows(name, previous) if previous is not None else (np.zeros(0, np.int64), None)
            ids, rows, evicted = _delta(ids, rows, old_ids, old_rows, _candidates(tables[key], previous, since))
            write_rows(fs, f"{folder}/tables/{name}.evicted.parquet", evicted, None, dim)
            evicted_written[name] = len(evicted)
        path = f"{folder}/tables/{name}.parquet"
        if dtype in BITS:
            _write_quantized(fs, path, ids, rows, BITS[dtype])
        else:
            write_rows(fs, path, ids, rows, dim)
        rows_written[name] = len(ids)
    return rows_written, evicted_written


def _write_quantized(fs: Any, path: str, ids: npt.NDArray[np.int64], rows: npt.NDArray[np.float32], bits: int) -> None:
    """``(id, codes, scale, bias)`` Parquet: ``codes`` ``fixed_size_list<uint8>``, ``scale`` and ``bias`` float16."""
    quantized = quantize(rows, bits)
    codes = pa.array(quantized.codes.reshape(-1), pa.uint8())
    columns = {
        "id": pa.array(ids, pa.int64()),
        "codes": pa.FixedSizeListArray.from_arrays(codes, code_bytes(rows.shape[1], bits)),
        "scale": pa.array(quantized.scale, pa.float16()),
        "bias": pa.array(quantized.bias, pa.float16()),
    }
    with fs.open(path, "wb") as file:
        pa_parquet.write_table(pa.table(columns), file)


def _write_item_vectors(
    fs: Any,
    folder: str,
    split: DenseForServing,
    tables: dict[tuple[str, str], TableRows],
    names: dict[str, tuple[str, str]],
) -> dict[str, Any]:
    """``items.parquet``: ``(id, vector)`` of every id of the retrieval model's item table, by its item tower; what
    ``model.json`` says of it."""
    items = split.items
    assert items is not None
    if items.table not in names:
        raise UserError(
            f"The item table '{items.table}' must be a sparse table of the checkpoint to be exported, but the "
            f"checkpoint holds only {sorted(names)}."
        )
    ids, rows = ids_and_rows(items.table, tables[names[items.table]])
    device = next((p.device for p in items.tower.parameters()), torch.device("cpu"))
    with torch.no_grad():
        vectors = items.tower.eval()(torch.from_numpy(rows).to(device)).float().cpu().numpy()
    write_rows(fs, f"{folder}/items.parquet", ids, vectors, items.dim)
    return {
        "file": "items.parquet",
        "table": items.table,
        "feature": items.feature,
        "dim": items.dim,
        "rows": len(ids),
        "temperature": split.temperature,
    }


def _write_values(
    fs: Any, folder: str, split: DenseForServing, texts: Mapping[str, pa.Table]
) -> tuple[dict[str, str], dict[str, int]]:
    """``tables/<name>.values.parquet`` for each table that features with texts look up: ``(id, feature, value)``,
    sorted by id; the file of each such table, and the distinct ids it names."""
    looked_up = [(pooled.table, pooled.feature) for pooled in split.lookups()]
    if split.items is not None:  # The item tower's ids name the rows of items.parquet.
        looked_up.append((split.items.table, split.items.feature))
    by_table: dict[str, list[pa.Table]] = {}
    for name, feature_name in dict.fromkeys(looked_up):
        if feature_name in texts:
            table = texts[feature_name].select(["id", "value"])
            feature = pa.array([feature_name] * table.num_rows, pa.string())
            by_table.setdefault(name, []).append(table.add_column(1, "feature", feature))
    files, num_ids = {}, {}
    for name, parts in by_table.items():
        files[name] = f"tables/{name}.values.parquet"
        merged = pa.concat_tables(parts, promote_options="permissive").sort_by([("id", "ascending")])
        with fs.open(f"{folder}/{files[name]}", "wb") as file:
            pa_parquet.write_table(merged, file)
        num_ids[name] = len(np.unique(merged.column("id").to_numpy()))
    return files, num_ids


def _candidates(table: TableRows, previous: TableRows | None, since: int | None) -> npt.NDArray[np.int64] | None:
    """The ids whose rows may differ from the checkpoint of ``since``, as the checkpoints' change tracking says
    (``embedding.row_changes``): those the exported delta lists, where it lies over ``since``; with those
    ``since``'s delta lists, where both lie over one base; ``None`` (any id may) otherwise."""
    if table.base_step is None or table.changed_ids is None:
        return None
    if table.base_step == since:
        return np.concatenate([np.zeros(0, np.int64), *table.changed_ids])
    if previous is not None and previous.base_step == table.base_step and previous.changed_ids is not None:
        return np.concatenate([np.zeros(0, np.int64), *table.changed_ids, *previous.changed_ids])
    return None


def _delta(
    ids: npt.NDArray[np.int64],
    rows: npt.NDArray[np.float32],
    old_ids: npt.NDArray[np.int64],
    old_rows: npt.NDArray[np.float32] | None,
    candidates: npt.NDArray[np.int64] | None = None,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    """The rows of ids that are new or whose row changed at all, and the old ids no longer held (both id-sorted).
    With ``candidates``, the rows of known ids outside them are the old ones, and only theirs are compared."""
    position = np.searchsorted(old_ids, ids).clip(max=max(len(old_ids) - 1, 0))
    known = old_ids[position] == ids if len(old_ids) else np.zeros(len(ids), np.bool_)
    changed = ~known
    if candidates is not None:
        known &= np.isin(ids, candidates)
    if old_rows is not None and known.any():
        changed[known] = (rows[known] != old_rows[position[known]]).any(axis=1)
    evicted = np.setdiff1d(old_ids, ids, assume_unique=True)
    return ids[changed], rows[changed], evicted.astype(np.int64)


def _model_json(
    read: _ReadOut, names: dict[str, tuple[str, str]], rows: dict[str, int], values: dict[str, str], dtype: str
) -> dict[str, Any]:
    split, tables, since = read.split, read.tables, read.since_step
    return {
        "format": EXPORT_FORMAT,
        "step": read.step,
        "since": since,
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "program": read.program,
        "num_dense": split.num_dense,
        "inputs": [{"feature": p.feature, "table": p.table, "dim": p.dim, "pooling": p.pooling} for p in split.inputs],
        **({"sequences": [asdict(sequence) for sequence in split.sequences]} if split.sequences else {}),
        **({"outputs": list(split.outputs)} if split.outputs else {}),
        "tables": {
            name: {
                "file": f"tables/{name}.parquet",
                "evicted": None if since is None else f"tables/{name}.evicted.parquet",
                "values": values.get(name),
                "dim": tables[key].dim,
                "kind": tables[key].kind,
                "rows": rows[name],
                "dtype": dtype,
                "row_bytes": _row_bytes(tables[key].dim, dtype),
            }
            for name, key in names.items()
        },
    }


def _row_bytes(dim: int, dtype: str) -> int:
    """A row's bytes: 4 a value in float32; a quantised row's codes and its fp16 scale and bias (FBGEMM's fused row)."""
    return code_bytes(dim, BITS[dtype]) + 4 if dtype in BITS else 4 * dim


def _write_json(fs: Any, path: str, value: Any) -> None:
    with fs.open(path, "w") as file:
        json.dump(value, file, indent=2, default=str)
        file.write("\n")
