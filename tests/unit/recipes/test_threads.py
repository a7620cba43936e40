"""Each rank computes with its share of its node's cores, in torch and numba alike (GitHub issue 17): the share, the
pool numba starts with under torchrun, and the line that says so."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numba
import pytest
import torch

from recipes.errors import ConfigError
from recipes.runtime import threads
from recipes.runtime.threads import parse_threads, size_numba_pool, threads_per_rank, use_threads


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
    ("device", "cores", "local_world_size", "requested", "expected"),
    [
        ("cpu", 16, None, None, 1),  # the step's threads take the cores
        ("cuda", 16, None, None, 4),  # at most 4
        ("cuda", 16, "4", None, 2),  # a rank's share of 4, less the main thread's and the pipeline's
        ("cuda", 2, None, None, 1),  # never fewer than one
        ("cuda", 16, None, 7, 7),  # dataset.parse_threads wins
        ("cpu", 16, None, 3, 3),
    ],
)
def test_a_reader_parses_on_one_thread_on_a_cpu_and_on_the_cores_a_gpu_leaves_idle(
    monkeypatch: pytest.MonkeyPatch, device: str, cores: int, local_world_size: str | None, requested: int | None,
    expected: int,
) -> None:  # fmt: skip
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    if local_world_size is None:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", local_world_size)

    assert parse_threads(requested, torch.device(device)) == expected


@pytest.mark.parametrize(
    ("local_world_size", "numba_threads", "expected"),
    [("2", None, "1"), ("2", "2", "2"), (None, None, None)],
    ids=["under torchrun", "set by the user", "one process"],
)
def test_numbas_pool_is_sized_for_the_rank_under_torchrun(
    monkeypatch: pytest.MonkeyPatch, local_world_size: str | None, numba_threads: str | None, expected: str | None
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    # A copy of the environment: what `size_numba_pool` sets must not reach numba's config in later tests.
    monkeypatch.setattr(os, "environ", dict(os.environ))
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
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(pool + 1)), raising=False)

    line = use_threads(pool + 1)

    assert torch.get_num_threads() == pool + 1 and numba.get_num_threads() == pool
    assert f"(numba {pool}: NUMBA_NUM_THREADS)" in line


def test_more_threads_than_the_cores_are_refused_naming_the_key_before_any_thread_is_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 100,000 exhausted the machine's processes and died of SIGSEGV without a word.
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    before = torch.get_num_threads(), numba.get_num_threads()

    with pytest.raises(ConfigError, match=r"`gang.threads_per_rank` must be at most the 2 cores .* is 100000 instead"):
        use_threads(100_000)
    with pytest.raises(ConfigError, match=r"`dataset.parse_threads` must be at most the 2 cores .* is 3 instead"):
        parse_threads(3, torch.device("cuda"))

    assert (torch.get_num_threads(), numba.get_num_threads()) == before
    assert use_threads(2).startswith("threads: 2 per rank") and parse_threads(2, torch.device("cpu")) == 2


def _machine(monkeypatch: pytest.MonkeyPatch, samples: list[dict[int, tuple[int, int]]]) -> None:
    """Two cores whose /proc/stat readings (busy and idle jiffies per core) are ``samples``, in turn."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setattr(threads, "_cpu_times", lambda cores: samples.pop(0))
    monkeypatch.setattr(threads.time, "sleep", lambda seconds: None)


def test_a_core_other_work_keeps_busy_is_left_to_it_and_the_line_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    # Core 0 busy all the interval, core 1 idle for 90 of its 100 jiffies.
    _machine(monkeypatch, [{0: (100, 100), 1: (100, 100)}, {0: (200, 100), 1: (110, 190)}])

    line = use_threads(None)

    assert torch.get_num_threads() == 1
    assert line == (
        "threads: 1 per rank for torch and numba, from 1 of 2 cores free (other work keeps 1.1 busy) "
        "/ 1 rank(s) on this node"
    )


def test_an_idle_machine_gives_every_core_and_where_the_os_does_not_tell_the_cores_present_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _machine(monkeypatch, [{0: (0, 0), 1: (0, 0)}, {0: (1, 99), 1: (0, 100)}])
    assert threads.free_cores() == pytest.approx(1.99)

    _machine(monkeypatch, [{}, {}])
    assert threads.free_cores() is None
    _machine(monkeypatch, [{}, {}])
    assert use_threads(None).endswith("from 2 cores / 1 rank(s) on this node")
