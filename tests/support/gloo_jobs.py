"""Jobs of real gloo processes on this machine, for the tests that spawn them."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import socket
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.multiprocessing import start_processes

from gang import Gangs, ProcessGroupGang, setup_gangs

# What every rank imports: the fork server imports it once, and each rank starts as a fork of it, in a fraction of
# a second instead of the 2 to 3 seconds of CPU a spawned rank spends importing torch on its own.
_PRELOADED = ["torch", "torch.distributed", "numba", "embedding", "gang", "units"]


def start_ranks(worker: Callable[..., None], args: tuple[Any, ...], world_size: int) -> None:
    """Run ``worker(rank, *args)`` in ``world_size`` new processes and wait for them; a rank's error is raised here.

    The ranks fork from a fork server (a fresh process, never a fork of the test's own, whose numba and OpenMP
    threads a fork would break), like torch's ``spawn`` but without each rank importing torch anew.
    """
    multiprocessing.set_forkserver_preload(_PRELOADED)
    start_processes(worker, args=args, nprocs=world_size, join=True, start_method="forkserver")


def free_port() -> int:
    """A port on localhost no one listens on, for a job's rendezvous."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def gloo_gang(rank: int, world_size: int, port: int) -> Iterator[ProcessGroupGang]:
    """This process as rank ``rank`` of a gloo job of ``world_size`` with its rendezvous on ``port``, left as
    ``_leaving_together`` says."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    with _leaving_together():
        assert dist.group.WORLD is not None
        yield ProcessGroupGang(dist.group.WORLD, torch.device("cpu"))


@contextlib.contextmanager
def gloo_gangs(rank: int, world_size: int, port: int, tp_size: int) -> Iterator[Gangs]:
    """This process as rank ``rank`` of a gloo job, with the gangs a job of ``gang.tp_size=tp_size`` has: its
    variables as torchrun would set them, then ``setup_gangs`` (the DP and TP gangs and their device mesh)."""
    variables = {"RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": world_size, "MASTER_PORT": port}
    os.environ.update(MASTER_ADDR="127.0.0.1", **{name: str(value) for name, value in variables.items()})
    gangs = setup_gangs(torch.device("cpu"), tp_size)
    with _leaving_together():
        yield gangs


@contextlib.contextmanager
def _leaving_together() -> Iterator[None]:
    """On leaving, each rank waits for the others, so that none tears gloo down while a peer still talks to it;
    after a body that ran to its end, it leaves without the interpreter's teardown, where gloo sometimes aborts
    (SIGABRT). A body that raised ends the process with its error."""
    try:
        yield
    finally:
        dist.barrier()
        dist.destroy_process_group()
    os._exit(0)
