"""Hash tables from the command line (GitHub issue 15): a bad policy, a checkpoint of the other kind and tables
larger than memory stop in one line with exit 2; a full table without eviction stops the run with exit 1 and
leaves the last checkpoint whole; TensorBoard shows every table's rows used, load factor and id counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from embedding.eviction import EvictionConfig, TtlConfig
from recipes.cli import main
from recipes.job import JobSpec, resolve_job
from resume_helpers import committed_steps, tensorboard_scalars

CTR_HASH = ["model.embeddings.kind=hash", "trainer.max_num_steps=4", "metrics.recorders.console=false"]
# 300 rows per table for about 1000 values a feature (C1-C26): the tables fill within a few dozen steps.
SMALL_DYNAMIC = [
    "dataset.synthetic_rows=6000",
    "dataset.batch_size=64",
    "dataset.num_embeddings_per_feature=[300]",
    "metrics.recorders.console=false",
]
STATISTICS = ("rows_used", "load_factor", "admitted", "rejected", "evicted")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.embeddings.hash.min_count=0", "`model.embeddings.hash.min_count` must be an integer >= 1, but is 0"),
        ("model.embeddings.hash.admit_probability=0", "`model.embeddings.hash.admit_probability` must be a finite"),
        ("model.embeddings.hash.admit_probability=1.5", "must be a finite number in (0, 1], but is 1.5 instead"),
        (
            "model.embeddings.hash.eviction=fifo",
            "`model.embeddings.hash.eviction.name` must be one of lfu, lru, none, ttl, but is 'fifo' instead",
        ),
        ("model.embeddings.hash.eviction.ttl_steps=5", "Unknown config key 'model.embeddings.hash.eviction.ttl_steps'"),
        (  # as a run's config.yaml had it before eviction policies had options of their own
            "model.embeddings.hash.ttl_steps=null",
            "Unknown config key 'model.embeddings.hash.ttl_steps' (from the command line). Did you mean "
            "'model.embeddings.hash.eviction.ttl_steps'?",
        ),
        ("dataset.vocab_size=0", "`dataset.vocab_size` must be an integer >= 1, but is 0 instead"),
    ],
)
def test_a_bad_hash_table_config_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str, message: str
) -> None:
    code, err = run(capsys, "train", "ctr_tiny", "-o", str(tmp_path / "run"), *CTR_HASH, override)

    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize(
    ("override", "eviction"),
    [
        ("model.embeddings.hash.eviction=lfu", EvictionConfig("lfu")),
        ("model.embeddings.hash.eviction={name: ttl, ttl_steps: 100}", TtlConfig(ttl_steps=100)),
    ],
)
def test_an_eviction_policy_is_named_alone_or_with_its_options(override: str, eviction: EvictionConfig) -> None:
    config = resolve_job(JobSpec("ctr_tiny", overrides=[override])).config

    assert config.model.embeddings.hash.to_policy().eviction == eviction  # type: ignore[attr-defined]


def test_tables_larger_than_memory_stop_at_start_up_naming_the_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run(
        capsys,
        "train",
        "dlrm_criteo_tiny_dynamic",
        "-o",
        str(tmp_path / "run"),
        *SMALL_DYNAMIC,
        "dataset.num_embeddings_per_feature=[2000000000]",  # 26 tables of 2e9 rows: terabytes
    )

    assert code == 2
    assert err.startswith("error: The sparse tables need ") and " GiB on rank 0 (cpu), but only " in err
    assert len(err.strip().splitlines()) == 1


def test_a_hash_checkpoint_does_not_load_into_a_fixed_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output_dir = str(tmp_path / "run")
    assert run(capsys, "train", "ctr_tiny", "-o", output_dir, *CTR_HASH)[0] == 0

    code, err = run(capsys, "eval", output_dir, "model.embeddings.kind=fixed")

    assert code == 2
    assert err.strip() == (
        "error: Table 'cat_0' is a fixed table, but the checkpoint holds a hash table of that name: "
        "set its kind to hash to load it."
    )


def test_a_full_table_without_eviction_stops_the_run_and_the_last_checkpoint_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output_dir = tmp_path / "run"
    code, err = run(
        capsys,
        "train",
        "dlrm_criteo_tiny_dynamic",
        "-o",
        str(output_dir),
        *SMALL_DYNAMIC,
        "trainer.max_num_steps=100",
        "checkpoint.every_n_steps=10",
        "model.embeddings.hash.eviction=none",
    )

    assert code == 1
    assert len(err.strip().splitlines()) == 1, err
    assert "is full: all 300 rows of this rank's shard hold ids and its eviction is 'none'" in err
    [last] = committed_steps(output_dir)[-1:]
    assert 10 <= last < 100
    assert run(capsys, "eval", str(output_dir), "--checkpoint", str(last))[0] == 0


def test_tensorboard_shows_each_tables_rows_load_factor_and_id_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output_dir = tmp_path / "run"
    args = [
        "-o",
        str(output_dir),
        *SMALL_DYNAMIC,
        "trainer.max_num_steps=60",
        "trainer.publish_metrics_every_n_steps=20",
    ]
    assert run(capsys, "train", "dlrm_criteo_tiny_dynamic", *args)[0] == 0

    for table in ("C1", "C26"):
        curves = {name: tensorboard_scalars(output_dir, "train", f"hash_tables/{table}/{name}") for name in STATISTICS}
        assert all([step for step, _ in curve] == [20, 40, 60] for curve in curves.values()), curves
        last = {name: curve[-1][1] for name, curve in curves.items()}
        assert last["rows_used"] == 300 and last["load_factor"] == 1.0  # the table filled up
        assert last["admitted"] - last["evicted"] == last["rows_used"]
        assert last["rejected"] > 0  # min_count 2: ids seen once wait
        admitted = [value for _, value in curves["admitted"]]
        assert admitted == sorted(admitted)  # cumulative counts
