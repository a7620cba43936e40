"""Each rank computes with its share of its node's cores, in torch and numba alike (GitHub issue 17)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numba
import pytest
import torch

from recipes.threads import size_numba_pool, threads_per_rank, use_threads
from resume_helpers import check_ok, run_recipes


@pytest.fixture(autouse=True)
def restore_threads() -> Iterator[None]:
    torch_threads, numba_threads = torch.get_num_threads(), numba.get_num_threads()
    yield
    torch.set_num_threads(torch_threads)
    numba.set_num_threads(numba_threads)


@pytest.mark.parametrize(
    ("cores", "local_world_size", "requested", "expected"),
    [
        (8, None, None, 8),  # one process: every core
        (8, "2", None, 4),
        (8, "3", None, 2),  # the remainder stays idle rather than oversubscribed
        (2, "4", None, 1),  # never fewer than one
        (8, "2", 3, 3),  # gang.threads_per_rank wins
    ],
)
def test_a_rank_takes_its_share_of_the_cores_it_may_run_on(
    monkeypatch: pytest.MonkeyPatch, cores: int, local_world_size: str | None, requested: int | None, expected: int
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(100, 100 + cores)), raising=False)
    if local_world_size is None:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", local_world_size)

    assert threads_per_rank(requested) == expected


@pytest.mark.parametrize(
    ("local_world_size", "numba_threads", "expected"),
    [("2", None, "1"), ("2", "2", "2"), (None, None, None)],
    ids=["under torchrun", "set by the user", "one process"],
)
def test_numbas_pool_is_sized_for_the_rank_under_torchrun(
    monkeypatch: pytest.MonkeyPatch, local_world_size: str | None, numba_threads: str | None, expected: str | None
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    for name, value in (("LOCAL_WORLD_SIZE", local_world_size), ("NUMBA_NUM_THREADS", numba_threads)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)

    size_numba_pool()

    assert os.environ.get("NUMBA_NUM_THREADS") == expected


def test_use_threads_sets_torch_and_numba_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")

    line = use_threads(1)

    assert torch.get_num_threads() == 1 and numba.get_num_threads() == 1
    assert line == "threads: 1 per rank for torch and numba, from gang.threads_per_rank"


def test_numba_never_gets_more_threads_than_its_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = numba.config.NUMBA_NUM_THREADS

    line = use_threads(pool + 1)

    assert torch.get_num_threads() == pool + 1 and numba.get_num_threads() == pool
    assert f"(numba {pool}: NUMBA_NUM_THREADS)" in line


@pytest.mark.slow
def test_two_ranks_split_the_cores_and_the_start_up_line_says_how(tmp_path: Path) -> None:
    output_dir = tmp_path / "run"
    args = ["train", "ctr_tiny", "-o", str(output_dir), "trainer.max_num_steps=5", "metrics.recorders.console=false"]
    result = check_ok(run_recipes(tmp_path, *args, "--nproc", "2"))

    share = max(1, len(os.sched_getaffinity(0)) // 2)
    expected = f"threads: {share} per rank for torch and numba"
    assert f"{expected}, from {len(os.sched_getaffinity(0))} cores / 2 rank(s) on this node" in result.stdout
    for rank in (0, 1):
        assert expected in (output_dir / "logs" / f"rank_{rank}.log").read_text()
        assert f"numba pool of {share} thread(s)" in (output_dir / "logs" / f"rank_{rank}.log").read_text()
