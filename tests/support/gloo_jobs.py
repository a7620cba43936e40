"""Jobs of real gloo processes on this machine, for the tests that spawn them."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator

import torch
import torch.distributed as dist

from gang import ProcessGroupGang


def free_port() -> int:
    """A port on localhost no one listens on, for a job's rendezvous."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def gloo_gang(rank: int, world_size: int, port: int) -> Iterator[ProcessGroupGang]:
    """This process as rank ``rank`` of a gloo job of ``world_size`` with its rendezvous on ``port``.

    On leaving, each rank waits for the others, so that none tears gloo down while a peer still talks to it;
    after a body that ran to its end, it leaves without the interpreter's teardown, where gloo sometimes aborts
    (SIGABRT). A body that raised ends the process with its error.
    """
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        assert dist.group.WORLD is not None
        yield ProcessGroupGang(dist.group.WORLD, torch.device("cpu"))
    finally:
        dist.barrier()
        dist.destroy_process_group()
    os._exit(0)
