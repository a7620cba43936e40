"""``export-tables``: every sparse table of a checkpoint as ``(id, embedding)`` Parquet, equal to what the
tables look up once the checkpoint is loaded, merged from every rank, written whole or not at all."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pa_parquet
import pytest
import torch

from embedding import EmbeddingTableConfig, JaggedIds, ShardedEmbeddingCollection, SparseFeatures
from recipes.cli.job import resolve_job
from recipes.cli.job_spec import JobSpec
from recipes.cli.main import main
from support.resume_helpers import check_ok, run_recipes

# Checkpoints at steps 3 and 6, all kept, so that `best` and `last` can differ.
SHORT = [
    "trainer.max_num_steps=6",
    "trainer.validate_every_n_steps=3",
    "checkpoint.every_n_steps=3",
    "checkpoint.keep_last_n=null",
    "checkpoint.keep_best_n=null",
    "metrics.recorders.console=false",
]
SMALL_CRITEO = ["dataset.synthetic_rows=4000", "dataset.batch_size=64"]


def export(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["export-tables", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def read_exported(path: str) -> tuple[np.ndarray, np.ndarray]:
    """The ids and the ``[rows, dim]`` embeddings of an exported file, after checking its schema."""
    with fsspec.open(path, "rb") as file:
        table = pa_parquet.read_table(file)
    assert table.schema.field("id").type == pa.int64()
    embedding_type = table.schema.field("embedding").type
    assert pa.types.is_fixed_size_list(embedding_type) and embedding_type.value_type == pa.float32()
    ids = table.column("id").to_numpy()
    rows = np.stack(table.column("embedding").to_numpy(zero_copy_only=False)).astype(np.float32)
    assert rows.shape == (len(ids), embedding_type.list_size)
    return ids, rows


def rank_states(run: Path, step: int) -> list[dict[str, Any]]:
    files = sorted((run / f"checkpoints/step_{step}").glob("rank_*.pt"), key=lambda p: int(p.stem[5:]))
    return [torch.load(path, weights_only=True) for path in files]


def loaded_tables(run: Path, step: int) -> dict[str, ShardedEmbeddingCollection]:
    """Each table alone in a collection of one process, shaped as the run's pieces say, loaded from the
    checkpoint's pieces of every rank, in eval mode."""
    ranks = rank_states(run, step)
    [state_name] = ranks[0]["sharded"]
    pieces = [rank["sharded"][state_name] for rank in ranks]
    policy = resolve_job(JobSpec(str(run / "config.yaml"))).config.model.embeddings.hash.to_policy()  # type: ignore[attr-defined]
    tables = {}
    for name, piece in pieces[0]["tables"].items():
        kind = piece.get("kind", "fixed")
        dim = piece["dim"] if kind == "hash" else piece["weight"].size(1)
        collection = ShardedEmbeddingCollection(
            [EmbeddingTableConfig(name, piece["num_rows"], dim, (name,), kind=kind, hash_policy=policy)]
        )
        collection.load_sharded_state_dict(pieces)
        tables[name] = collection.eval()
    return tables


def look_up(collection: ShardedEmbeddingCollection, ids: np.ndarray) -> np.ndarray:
    """What the collection's one table returns for each id, alone in its bag."""
    [table] = collection.tables
    features = SparseFeatures({table.name: JaggedIds.from_dense(torch.from_numpy(ids.copy()).unsqueeze(1))})
    with torch.no_grad():
        return collection(features)[table.name].numpy()


def written_tables(out: str) -> dict[str, tuple[int, int, str]]:
    """The lines `export-tables` prints: table -> (rows, dim, path)."""
    tables = {}
    for line in out.strip().splitlines():
        name, rest = line.split(": ", 1)
        size, path = rest.split(" -> ")
        rows, dim = size.split(" rows x ")
        tables[name] = (int(rows.replace(",", "")), int(dim), path)
    return tables


def check_round_trip(run: Path, step: int, exported: Mapping[str, tuple[int, int, str]]) -> None:
    """Each exported table holds exactly the ids with rows, and each id's embedding is what a lookup returns."""
    tables = loaded_tables(run, step)
    assert set(exported) == set(tables)
    for name, (num_rows, dim, path) in exported.items():
        ids, rows = read_exported(path)
        collection = tables[name]
        shard = collection.shards[name]
        assert (len(ids), rows.shape[1]) == (num_rows, dim) == (len(ids), shard.config.dim)
        assert (np.diff(ids) > 0).all(), "ids must be sorted and distinct"
        if shard.dynamic is not None:
            np.testing.assert_array_equal(ids, np.sort(shard.dynamic.index.occupied()[1]))
            absent = np.setdiff1d(np.arange(ids.max() + 1, ids.max() + 4), ids)
            assert not look_up(collection, absent).any(), "an id without a row looks up zeros"
        else:
            np.testing.assert_array_equal(ids, np.arange(shard.config.num_rows))
        np.testing.assert_array_equal(look_up(collection, ids), rows)


@pytest.fixture(scope="module")
def ctr_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("export_ctr")
    check_ok(run_recipes(root, "train", "ctr_tiny", "-o", "run", *SHORT))
    return root / "run"


@pytest.fixture(scope="module")
def hash_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("export_hash")
    check_ok(run_recipes(root, "train", "dlrm_criteo_tiny_dynamic", "-o", "run", *SHORT, *SMALL_CRITEO))
    return root / "run"


def test_hash_tables_export_every_id_with_a_row_and_its_embedding(
    hash_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = export(capsys, str(hash_run), "-o", str(tmp_path / "tables"))

    assert code == 0, err
    exported = written_tables(out)
    assert len(exported) == 26 and all(path.endswith(f"/{name}.parquet") for name, (_, _, path) in exported.items())
    assert sorted(p.name for p in (tmp_path / "tables").iterdir()) == sorted(f"{name}.parquet" for name in exported)
    check_round_trip(hash_run, 6, exported)


@pytest.mark.parametrize("destination", ["local", "memory"])
def test_fixed_tables_export_rows_0_to_n(
    ctr_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], destination: str
) -> None:
    target = str(tmp_path / "tables") if destination == "local" else f"memory://export-{id(tmp_path)}/tables"
    try:
        code, out, err = export(capsys, str(ctr_run), "-o", target)

        assert code == 0, err
        exported = written_tables(out)
        assert exported and all(rows == 1000 for rows, _, _ in exported.values())
        check_round_trip(ctr_run, 6, exported)
        fs, path = fsspec.core.url_to_fs(target)
        assert [p.rsplit("/", 1)[1] for p in fs.ls(path.rsplit("/", 1)[0], detail=False)] == ["tables"]
    finally:
        if destination == "memory":
            fsspec.filesystem("memory").rm(target.removeprefix("memory://").split("/")[0], recursive=True)


def export_ok(capsys: pytest.CaptureFixture[str], run: Path, target: Path, *argv: str) -> dict[str, np.ndarray]:
    """The embeddings of every table exported from ``run`` to ``target``, by table."""
    code, out, err = export(capsys, str(run), "-o", str(target), *argv)
    assert code == 0, err
    return {name: read_exported(path)[1] for name, (_, _, path) in written_tables(out).items()}


def test_best_exports_the_best_scored_checkpoint(
    ctr_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    shutil.copytree(ctr_run, run)
    metadata_path = run / "checkpoints/step_3/metadata.json"  # make the earlier checkpoint the best-scored one
    metadata = json.loads(metadata_path.read_text())
    metadata["score"] = 2.0  # above any AUC, and the run's score (auc) is higher-better
    metadata_path.write_text(json.dumps(metadata))

    best = export_ok(capsys, run, tmp_path / "best", "--checkpoint", "best")
    step_3 = export_ok(capsys, run, tmp_path / "step_3", "--checkpoint", "step_3")
    last = export_ok(capsys, run, tmp_path / "last", "--checkpoint", "last")
    by_default = export_ok(capsys, run, tmp_path / "auto")  # the best scored checkpoint, where there is one

    assert best.keys() == step_3.keys() == last.keys()
    tables = loaded_tables(run, 3)
    for name, rows in best.items():
        np.testing.assert_array_equal(rows, step_3[name])
        np.testing.assert_array_equal(rows, by_default[name])
        np.testing.assert_array_equal(rows, look_up(tables[name], np.arange(len(rows))))
    assert any(not np.array_equal(best[name], last[name]) for name in best), "steps 3 and 6 must differ"


@pytest.mark.parametrize(
    ("case", "fragment"),
    [
        ("no run", "is not a run's output directory"),
        ("no checkpoint", "holds no checkpoint"),
        ("unknown step", "`--checkpoint` must be auto, last, best or one of the steps [3, 6], but is '99'"),
        ("unknown word", "`--checkpoint` must be auto, last, best or one of the steps [3, 6], but is 'newest'"),
        ("destination not empty", "`-o` must be a new or empty folder, but"),
        ("destination a file", "is a file"),
        ("destination unwritable", "`-o` must be a folder that can be written, but /proc/no/tables cannot be"),
        ("no destination", "required: -o/--output"),
    ],
)
def test_each_user_error_is_one_line_and_exit_2(
    ctr_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, fragment: str
) -> None:
    run, target = ctr_run, tmp_path / "tables"
    argv = ["-o", str(target)]
    if case == "no run":
        run = tmp_path / "missing"
    elif case == "no checkpoint":
        run = tmp_path / "fresh"
        run.mkdir()
        shutil.copy(ctr_run / "config.yaml", run / "config.yaml")
    elif case == "unknown step":
        argv += ["--checkpoint", "step_99"]
    elif case == "unknown word":
        argv += ["--checkpoint", "newest"]
    elif case == "destination not empty":
        target.mkdir()
        (target / "keep.txt").write_text("a user's file")
    elif case == "destination a file":
        target.write_text("a user's file")
    elif case == "destination unwritable":
        argv = ["-o", "/proc/no/tables"]
    else:
        argv = []
    before = sorted(p.name for p in tmp_path.iterdir())

    code, out, err = export(capsys, str(run), *argv)

    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], err
    assert "Traceback" not in err and out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "nothing is written"
    if case == "destination not empty":
        assert [p.name for p in target.iterdir()] == ["keep.txt"]


@pytest.mark.parametrize("destination", ["local", "memory"])
def test_an_empty_destination_folder_is_taken(
    ctr_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], destination: str
) -> None:
    target = str(tmp_path / "tables") if destination == "local" else f"memory://empty-{id(tmp_path)}/tables"
    fs, path = fsspec.core.url_to_fs(target)
    fs.makedirs(path)
    try:
        code, out, err = export(capsys, str(ctr_run), "-o", target)

        assert code == 0, err
        names = sorted(f"{name}.parquet" for name in written_tables(out))
        assert sorted(p.rsplit("/", 1)[1] for p in fs.ls(path, detail=False)) == names
        assert [p.rsplit("/", 1)[1] for p in fs.ls(path.rsplit("/", 1)[0], detail=False)] == ["tables"]
    finally:
        if destination == "memory":
            fs.rm(path.rsplit("/", 1)[0], recursive=True)


@pytest.mark.parametrize(
    ("preset", "extra"),
    [
        ("ctr_tiny", []),  # small tables: replicated, whole on both ranks
        ("ctr_tiny", ["model.embeddings.placement=row_wise"]),  # half the rows on each rank
        ("dlrm_criteo_tiny_dynamic", SMALL_CRITEO),  # ids hashed to the ranks
    ],
)
def test_a_two_rank_checkpoint_exports_the_rows_of_both_ranks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], preset: str, extra: list[str]
) -> None:
    check_ok(run_recipes(tmp_path, "train", preset, "-o", "run", *SHORT, *extra, "--nproc", "2", timeout=300))
    run = tmp_path / "run"
    ranks = rank_states(run, 6)
    assert len(ranks) == 2

    code, out, err = export(capsys, str(run), "-o", str(tmp_path / "tables"))

    assert code == 0, err
    exported = written_tables(out)
    check_round_trip(run, 6, exported)  # the 1-process tables load both ranks' pieces
    for name, (num_rows, _, _) in exported.items():
        pieces = [next(iter(rank["sharded"].values()))["tables"][name] for rank in ranks]
        held = [piece["weight"].size(0) for piece in pieces]
        if "row_wise" in " ".join(extra) or preset.endswith("dynamic"):
            assert all(held) and sum(held) == num_rows, (name, held, num_rows)  # merged, none twice
        else:
            assert held == [num_rows, num_rows]  # replicated: taken once
