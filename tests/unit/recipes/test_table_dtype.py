"""The dtype of sparse tables from the command line (GitHub issue 51): every misuse stops in one line with exit 2
before anything trains."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.cli_runs import run_main

ONE_STEP = ("trainer.max_num_steps=1", "dataset.synthetic_rows=2000", "metrics.recorders.console=false")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["model.embeddings.dtype=float64"],
            "Config key 'model.embeddings.dtype' must be one of 'float32', 'float16', 'bfloat16', but is 'float64' "
            "(str) instead",
        ),
        (
            ["model.embeddings.tables={C1: {dtype: half}}"],
            "Config key 'model.embeddings.tables' must be a mapping of a mapping (TableStorageSection), but is "
            "{'C1': {'dtype': 'half'}} (dict) instead",
        ),
        (
            ["model.embeddings.tables={C2: {storage: disk, dtype: float16}}"],
            "`dtype` of table 'C2' must be float32 for a table stored on disk (only tables on the device store "
            "half-precision rows yet), but is float16 instead.",
        ),
        (
            ["model.embeddings.dtype=bfloat16", "model.embeddings.backend=dense"],
            "`embeddings.backend` must be sparse for a table of half-precision rows, but is dense (table 'C1' is of "
            "bfloat16).",
        ),
    ],
)
def test_misuse_stops_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], overrides: list[str], message: str
) -> None:
    code, _, err = run_main(capsys, "train", "dlrm_criteo_tiny", "-o", str(tmp_path / "run"), *ONE_STEP, *overrides)

    assert code == 2, err
    assert err.startswith("error: ") and message in err, err
    assert len(err.strip().splitlines()) == 1


def test_a_table_of_its_own_dtype_trains_beside_the_others(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(
        capsys, "train", "dlrm_criteo_tiny", "-o", str(tmp_path / "run"), *ONE_STEP,
        "model.embeddings.tables={C3: {dtype: bfloat16}}",
    )  # fmt: skip

    assert code == 0, err
    lines = [line for line in (out + err).splitlines() if "sparse table '" in line]
    assert [line for line in lines if " bfloat16, " in line] == [next(line for line in lines if "'C3'" in line)]
