"""Tables on host or disk from the command line (GitHub issue 48): every misuse stops in one line with exit 2 before
anything trains, and tables too big for their tier are named with the tier that would hold them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from embedding import EmbeddingTableConfig, TableStorage, plan_sharding
from embedding.memory import TableMemoryError, check_tiers, tier_needs
from embedding.optimizers.rowwise_adagrad import RowwiseAdagradConfig
from support.cli_runs import run_main

ONE_STEP = ("trainer.max_num_steps=1", "dataset.synthetic_rows=2000", "metrics.recorders.console=false")


@pytest.mark.parametrize(
    ("preset", "overrides", "message"),
    [
        (
            "dlrm_criteo_tiny",
            ["model.embeddings.storage=ssd"],
            "Config key 'model.embeddings.storage' must be one of 'device', 'host', 'disk', but is 'ssd' (str) instead",
        ),
        (
            "dlrm_criteo_tiny",
            ["model.embeddings.tables={C99: {storage: disk}}"],
            "`embeddings.tables` must name tables of the model (C1, C2,",
        ),
        (
            "dlrm_criteo_tiny",
            ["model.embeddings.storage=disk", "model.embeddings.cache={rows: 10, bytes: 1000}"],
            "`embeddings.cache` must set rows or bytes, but sets both.",
        ),
        (
            "dlrm_criteo_tiny",
            ["model.embeddings.storage=disk", "model.embeddings.backend=dense"],
            "`embeddings.backend` must be sparse for a table stored off the device, but is dense (table 'C1'",
        ),
        (
            "dlrm_criteo_tiny",
            [
                "model.embeddings.storage=disk",
                "model.embeddings.cache.rows=16",
                "dataset.num_embeddings_per_feature=[400000000000]",
            ],
            "The disk stores of the sparse tables need ",
        ),
    ],
)
def test_misuse_stops_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], preset: str, overrides: list[str], message: str
) -> None:
    code, _, err = run_main(capsys, "train", preset, "-o", str(tmp_path / "run"), *ONE_STEP, *overrides)

    assert code == 2, err
    assert err.startswith("error: ") and message in err, err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run" / "checkpoints").exists() or not any((tmp_path / "run" / "checkpoints").iterdir())


def test_a_disk_store_needs_a_local_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(
        capsys,
        "train",
        "dlrm_criteo_tiny",
        "-o",
        str(tmp_path / "run"),
        *ONE_STEP,
        "model.embeddings.storage=disk",
        "model.embeddings.storage_dir=memory://stores",
    )

    assert code == 2, err
    assert "The disk store of table 'C1' must be in a local directory, but would be in memory://stores: " in err


def tables(*storages: TableStorage) -> list[EmbeddingTableConfig]:
    return [
        EmbeddingTableConfig(f"t{i}", 1_000_000, 64, (f"f{i}",), storage=storage) for i, storage in enumerate(storages)
    ]


def test_tables_that_do_not_fit_are_named_with_the_tier_that_holds_them(monkeypatch: pytest.MonkeyPatch) -> None:
    configs = tables(TableStorage(), TableStorage(), TableStorage("disk", cache_rows=1000), TableStorage())
    configs[1] = EmbeddingTableConfig("t1", 4_000_000, 64, ("f1",))
    needs = tier_needs(configs, plan_sharding(configs, 1), 0, RowwiseAdagradConfig())
    # room for one table of 1,000,000 x 64 with its state and the cache, not for more
    monkeypatch.setattr("embedding.memory.available_bytes", lambda device: 300 * 2**20)

    with pytest.raises(TableMemoryError) as raised:
        check_tiers(needs, torch.device("cpu"), 0)

    message = str(raised.value)
    assert message.startswith("The sparse tables need 1.5 GiB on rank 0 (cpu) for rows, optimizer state and caches")
    assert "store 't1' (1.0 GiB) on disk, 't0' (0.2 GiB) on disk (`model.embeddings.tables.<name>.storage`)" in message
    assert "'t2'" not in message and "'t3'" not in message


def test_tables_that_fit_their_tiers_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    configs = tables(TableStorage("disk", cache_rows=1000), TableStorage("host", cache_bytes=2**20))
    needs = tier_needs(configs, plan_sharding(configs, 1), 0, RowwiseAdagradConfig())
    monkeypatch.setattr("embedding.memory.available_bytes", lambda device: 300 * 2**20)

    check_tiers(needs, torch.device("cpu"), 0)
    records = 1_000_000 * 65 * 4
    slots = 977 * 4096  # 4 bytes a row, to a whole page
    assert needs[0].far == 4096 + slots + records  # the disk store's header, its slots, its records
    assert needs[1].far == records
    assert needs[0].near == 1000 * 65 * 4 and needs[1].near == (2**20 // 260) * 260
