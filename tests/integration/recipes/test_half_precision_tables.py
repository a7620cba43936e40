"""Runs of ``ctr_tiny`` with float16 sparse tables: saved in their dtype, resumed bit for bit (the stochastic rounding
is keyed by seed, step, table and row, not by a generator's state), resumed into another dtype with one line saying
so, and trained on 2 ranks as on one (to the float32 arithmetic's differences)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from support.resume_helpers import (
    FINAL_STEP,
    assert_same_training,
    check_ok,
    checkpoints_dir,
    copy_run,
    load_verified,
    run_recipes,
    shared_run,
    train_args,
)

KEEP_ALL = ("checkpoint.keep_last_n=null", "checkpoint.keep_best_n=null")
FLOAT16 = "model.embeddings.dtype=float16"


@pytest.fixture(scope="module")
def float16_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 steps with float16 tables, every checkpoint kept: steps 10, 20, 30 and 40."""
    return shared_run(tmp_path_factory, "float16_kept_all", *KEEP_ALL, FLOAT16)


def cut_back_to(output_dir: Path, step: int) -> None:
    """Remove the checkpoints after ``step``, as if the run had died just after saving it."""
    for later in range(step + 10, FINAL_STEP + 1, 10):
        shutil.rmtree(checkpoints_dir(output_dir) / f"step_{later}")


def test_tables_are_saved_in_float16_and_the_report_says_so(float16_run: Path) -> None:
    pieces = load_verified(checkpoints_dir(float16_run) / f"step_{FINAL_STEP}", "rank_0.pt")["sharded"]
    tables = [table for collection in pieces.values() for table in collection["tables"].values()]

    assert tables and all(table["weight"].dtype == torch.float16 for table in tables)
    assert all(state.dtype == torch.float32 for table in tables for state in table["optimizer_state"].values())
    log = (float16_run / "logs" / "rank_0.log").read_text()
    assert " float16, " in next(line for line in log.splitlines() if "sparse table '" in line)


def test_a_run_of_float16_tables_resumes_bit_for_bit(tmp_path: Path, float16_run: Path) -> None:
    output_dir = copy_run(float16_run, tmp_path / "run")
    cut_back_to(output_dir, 20)

    check_ok(run_recipes(tmp_path, *train_args(output_dir, *KEEP_ALL, FLOAT16)))

    assert "Resumed from the checkpoint of step 20." in (output_dir / "logs" / "rank_0.log").read_text()
    assert_same_training(float16_run, output_dir, FINAL_STEP)


def test_a_run_resumed_with_another_dtype_converts_its_tables_and_says_so_in_one_line(
    tmp_path: Path, float16_run: Path
) -> None:
    output_dir = copy_run(float16_run, tmp_path / "run")
    cut_back_to(output_dir, 30)

    check_ok(run_recipes(tmp_path, *train_args(output_dir, *KEEP_ALL, "model.embeddings.dtype=bfloat16")))

    log = (output_dir / "logs" / "rank_0.log").read_text()
    (line,) = [line for line in log.splitlines() if "another dtype" in line]
    assert "loaded into tables of another dtype, converted: '" in line and "' float16 -> bfloat16" in line
    pieces = load_verified(checkpoints_dir(output_dir) / f"step_{FINAL_STEP}", "rank_0.pt")["sharded"]
    assert all(t["weight"].dtype == torch.bfloat16 for c in pieces.values() for t in c["tables"].values())


def whole_tables(output_dir: Path, step: int, num_ranks: int) -> dict[str, torch.Tensor]:
    """Every sparse table of a run's checkpoint, its rows put together from every rank's piece: a fixed table's by
    row, a hash table's by id (in id order)."""
    rows: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    for rank in range(num_ranks):
        pieces = load_verified(checkpoints_dir(output_dir) / f"step_{step}", f"rank_{rank}.pt")["sharded"]
        for path, collection in pieces.items():
            for name, piece in collection["tables"].items():
                if piece.get("kind") == "hash":
                    keys = piece["index"]["keys"]
                else:
                    keys = torch.arange(piece["row_start"], piece["row_end"])
                rows.setdefault(f"{path}/{name}", []).append((keys, piece["weight"]))
    tables = {}
    for name, parts in rows.items():
        keys, weight = torch.cat([k for k, _ in parts]), torch.cat([w for _, w in parts])
        unique, first = torch.unique(keys, return_inverse=True)
        tables[name] = weight.new_zeros(unique.numel(), weight.size(1)).index_copy_(0, first, weight)
    return tables


@pytest.mark.parametrize("kind", ["fixed", "hash"])
def test_float16_tables_train_on_2_ranks_as_on_one(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, float16_run: Path, kind: str
) -> None:
    """The rounding of a row is keyed by its table and global row (a hash table's: its id), so it does not change
    with the ranks; what does is the float32 arithmetic before it (gradients summed in another order, as in a float32
    run), which moves a rounding to the neighbouring value now and then: a few elements in a hundred after 40 steps,
    by a few units at most."""
    kind_key = f"model.embeddings.kind={kind}"
    on_one = (
        float16_run if kind == "fixed" else shared_run(tmp_path_factory, "float16_hash", *KEEP_ALL, FLOAT16, kind_key)
    )
    output_dir = tmp_path / "dp2"
    check_ok(run_recipes(tmp_path, *train_args(output_dir, *KEEP_ALL, FLOAT16, kind_key), "--nproc", "2"))

    one, two = whole_tables(on_one, FINAL_STEP, 1), whole_tables(output_dir, FINAL_STEP, 2)
    assert one.keys() == two.keys()
    for name, weight in one.items():
        assert two[name].dtype == torch.float16
        torch.testing.assert_close(two[name].float(), weight.float(), rtol=2e-3, atol=1e-4, msg=name)
        differ = weight.view(torch.int16) != two[name].view(torch.int16)
        assert float(differ.float().mean()) < 0.05, name
