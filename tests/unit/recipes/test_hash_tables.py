"""Hash tables from the command line (GitHub issue 15): a bad policy and tables larger than memory stop in one
line with exit 2, before anything trains; eviction policies are named alone or with their options."""

from __future__ import annotations

from pathlib import Path

import pytest

from embedding.eviction import EvictionConfig, TtlConfig
from recipes.cli.job import resolve_job
from recipes.cli.job_spec import JobSpec
from support.cli_runs import run_main
from support.overrides import CTR_HASH, SMALL_DYNAMIC


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
        (  # Once accepted: no id would ever be admitted.
            "model.embeddings.hash.min_count=100000000",
            "`min_count` of hash table 'cat_0' must be at most 1024, the count its count-min sketch of 1024 columns on "
            "rank 0 reaches before its counts halve, but is 100000000 instead: no id would ever be admitted.",
        ),
    ],
)
def test_a_bad_hash_table_config_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str, message: str
) -> None:
    code, _, err = run_main(capsys, "train", "ctr_tiny", "-o", str(tmp_path / "run"), *CTR_HASH, override)

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
    code, _, err = run_main(
        capsys,
        "train",
        "dlrm_criteo_tiny_dynamic",
        "-o",
        str(tmp_path / "run"),
        *SMALL_DYNAMIC,
        "dataset.num_embeddings_per_feature=[2000000000]",  # 26 tables of 2e9 rows: terabytes
    )

    assert code == 2
    assert err.startswith("error: The sparse tables need ") and " GiB on rank 0 (cpu) for rows, optimizer " in err
    assert len(err.strip().splitlines()) == 1
