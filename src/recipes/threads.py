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


def use_threads(requested: int | None) -> str:
    """Set torch's and numba's threads for this rank; return the start-up line that says how many."""
    import numba
    import torch

    count = threads_per_rank(requested)
    torch.set_num_threads(count)
    # numba's pool is sized when it starts (NUMBA_NUM_THREADS, by default the machine's cores): it can
    # use fewer threads than that, never more.
    numba_count = min(count, numba.config.NUMBA_NUM_THREADS)
    numba.set_num_threads(numba_count)
    why = (
        "gang.threads_per_rank"
        if requested is not None
        else f"{len(_usable_cores())} cores / {_ranks_on_this_node()} rank(s) on this node"
    )
    numba_note = "" if numba_count == count else f" (numba {numba_count}: NUMBA_NUM_THREADS)"
    return f"threads: {count} per rank for torch and numba{numba_note}, from {why}"


def _usable_cores() -> set[int]:
    if hasattr(os, "sched_getaffinity"):
        return os.sched_getaffinity(0)
    return set(range(os.cpu_count() or 1))


def _ranks_on_this_node() -> int:
    """The processes torchrun started on this node (``LOCAL_WORLD_SIZE``); 1 outside torchrun."""
    return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
