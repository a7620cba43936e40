"""How many threads each rank computes with: its share of its node's cores, for torch and numba alike.

torchrun gives every worker one OpenMP thread, while numba starts as many threads as the
machine has cores in every rank, whatever torch does: two ranks on two cores ran one torch
thread and two numba threads each, and DLRM's 2-rank job reached a quarter of one rank's
steps/s (half with numba held to one thread too). So each rank takes the cores it may run on
(its CPU affinity) divided by the ranks on its node, unless ``gang.threads_per_rank`` says
otherwise.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from recipes.errors import ConfigError

if TYPE_CHECKING:
    import torch

# numba and torch are imported where they are used: `size_numba_pool` must run before numba is
# first imported, from `python -m recipes`'s first lines.


def size_numba_pool() -> None:
    """Under torchrun, start numba's pool with this rank's share of the cores (unless NUMBA_NUM_THREADS says).

    numba sizes its pool once, when it is imported; pool threads beyond those a kernel uses still
    spin-wait after each parallel kernel, on the cores the other ranks compute on. Two DLRM ranks
    on two cores with pools of two threads, told to use one, ran 3 steps/s at batch 512; with pools of one, 20.
    """
    if "LOCAL_WORLD_SIZE" in os.environ and "NUMBA_NUM_THREADS" not in os.environ:
        os.environ["NUMBA_NUM_THREADS"] = str(threads_per_rank(None))


def threads_per_rank(requested: int | None) -> int:
    """``requested``, or this rank's share of the cores it may run on."""
    if requested is not None:
        return requested
    return max(1, len(_usable_cores()) // _ranks_on_this_node())


MAX_AUTO_PARSE_THREADS = 4
"""The most threads a reader parses with by default on a GPU: with 4, DLRM's reader kept 1.23x ahead of an H200's
step at batch 65,536 (docs/benchmarks.md, "The GPU checks"); more were not measured."""


def parse_threads(requested: int | None, device: torch.device) -> int:
    """``requested``, or the threads a rank's reader parses its files with (``dataset.parse_threads``).

    On a GPU the CPU's cores do not compute the step, and parsing is most of reading (2 threads parse a Criteo TSV
    1.7-1.9x as fast as 1), which a GPU's step can outrun: the reader takes this rank's share of the cores less two
    (the main thread and the pipeline's), at most ``MAX_AUTO_PARSE_THREADS``. On a CPU, 1: the step's threads take
    the cores.
    """
    if requested is not None:
        check_at_most_the_cores(requested, "dataset.parse_threads")
        return requested
    if device.type == "cpu":
        return 1
    return max(1, min(MAX_AUTO_PARSE_THREADS, threads_per_rank(None) - 2))


def check_at_most_the_cores(requested: int | None, key: str) -> None:
    """Refuse more threads than the cores this process may run on, as the config key ``key`` asks: they would only
    wait for each other, and 100,000 exhausted the machine's processes and died of SIGSEGV without a word."""
    cores = len(_usable_cores())
    if requested is not None and requested > cores:
        raise ConfigError(
            f"`{key}` must be at most the {cores} cores this process may run on, but is {requested} instead."
        )


def free_cores(interval_s: float = 0.25) -> float | None:
    """How many of the cores this process may run on the rest of the machine leaves idle, measured over
    ``interval_s`` from Linux's /proc/stat (``None`` where the OS does not tell). This process, and the other
    ranks of its job, which measure at the same time, sleep meanwhile."""
    usable = _usable_cores()
    first = _cpu_times(usable)
    time.sleep(interval_s)
    second = _cpu_times(usable)
    if not first or first.keys() != second.keys():
        return None
    idle = 0.0
    for core, (busy_before, idle_before) in first.items():
        busy_after, idle_after = second[core]
        elapsed = (busy_after - busy_before) + (idle_after - idle_before)
        idle += (idle_after - idle_before) / elapsed if elapsed > 0 else 1.0
    return idle


def _cpu_times(cores: set[int]) -> dict[int, tuple[int, int]]:
    """Per core of ``cores``: the jiffies it spent busy, and idle (waiting for I/O counts as idle)."""
    times = {}
    try:
        with open("/proc/stat") as stat:
            for line in stat:
                name, *fields = line.split()
                if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cores:
                    continue
                user, nice, system, idle, iowait, irq, softirq, steal = (int(value) for value in fields[:8])
                times[int(name[3:])] = (user + nice + system + irq + softirq + steal, idle + iowait)
    except (OSError, ValueError):
        return {}
    return times


def use_threads(requested: int | None) -> str:
    """Set torch's and numba's threads for this rank; return the start-up line that says how many, and why.

    ``requested`` (``gang.threads_per_rank``) must be at most the cores this process may run on, checked before
    any thread is made. Without it, a rank takes its share of the cores that
    are free now, not merely present: on a machine where other work keeps a core busy, a thread there would make
    every parallel region of a step wait for the other work's time slice (see docs/benchmarks.md, "Training on a shared
    machine").
    """
    import numba
    import torch

    ranks, present = _ranks_on_this_node(), len(_usable_cores())
    check_at_most_the_cores(requested, "gang.threads_per_rank")
    free = None if requested is not None else free_cores()
    if requested is not None:
        count, why = requested, "gang.threads_per_rank"
    elif free is None:
        count, why = threads_per_rank(None), f"{present} cores / {ranks} rank(s) on this node"
    else:
        usable = max(1, min(present, round(free)))
        count = max(1, usable // ranks)
        busy = max(0.0, present - free)
        why = f"{usable} of {present} cores free (other work keeps {busy:.1f} busy) / {ranks} rank(s) on this node"
    torch.set_num_threads(count)
    # numba's pool is sized when it starts (NUMBA_NUM_THREADS, by default the machine's cores): it can
    # use fewer threads than that, never more.
    numba_count = min(count, numba.config.NUMBA_NUM_THREADS)
    numba.set_num_threads(numba_count)
    numba_note = "" if numba_count == count else f" (numba {numba_count}: NUMBA_NUM_THREADS)"
    return f"threads: {count} per rank for torch and numba{numba_note}, from {why}"


def leaves_a_core() -> bool:
    """Whether the compute threads of this node's ranks (this rank's count each) leave one of its cores idle: a
    core for a helper thread, such as the train pipeline's, to run on without preempting a parallel region."""
    import torch

    return torch.get_num_threads() * _ranks_on_this_node() < len(_usable_cores())


def spans_several_nodes() -> bool:
    """Whether the job's ranks run on more than one node (torchrun's ``WORLD_SIZE`` over ``LOCAL_WORLD_SIZE``)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > _ranks_on_this_node()


def _usable_cores() -> set[int]:
    if hasattr(os, "sched_getaffinity"):
        return os.sched_getaffinity(0)
    return set(range(os.cpu_count() or 1))


def _ranks_on_this_node() -> int:
    """The processes torchrun started on this node (``LOCAL_WORLD_SIZE``); 1 outside torchrun."""
    return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
