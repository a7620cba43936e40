"""Build the root, data-parallel and tensor-parallel gangs of a job from torchrun's environment."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from gang.fake import FakeGang
from gang.gang import Gang
from gang.process_group import ProcessGroupGang, backend_for


@dataclass(frozen=True)
class Gangs:
    """The gangs of one process: ``root`` holds every process, ``dp`` x ``tp`` = ``root``.

    Ranks are laid out row-major, as in a ``DeviceMesh`` of shape ``(dp, tp)``: root rank
    ``r`` is TP rank ``r % tp.size`` of DP rank ``r // tp.size``. ``mesh`` is that device
    mesh, for ``torch.distributed.tensor`` APIs; it is ``None`` in a single-process job.
    """

    root: Gang
    dp: Gang
    tp: Gang
    mesh: DeviceMesh | None = None

    def close(self) -> None:
        self.root.close()

    def clone(self) -> Gangs:
        """New process groups of the same ranks as these gangs, for collectives that run beside theirs (a train
        pipeline's, on another thread) and must never pair with them; ``mesh`` stays this one's.

        Every process of the job calls it at the same point: torch creates any process group, even one a
        process is not in, by a call of every process, in the same order.
        """
        if self.mesh is None:
            return self
        layout, device = self.mesh.mesh, self.root.device
        return Gangs(
            root=_new_gang([layout.flatten().tolist()], device),
            dp=_new_gang(layout.t().tolist(), device),  # a DP group is a column of the (dp, tp) layout
            tp=_new_gang(layout.tolist(), device),
            mesh=self.mesh,
        )


def default_device() -> torch.device:
    """This process's device: the CUDA device of its local rank if there is one, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def world_size_from_env() -> int:
    """The job's world size as torchrun announces it (1 when not launched by torchrun)."""
    value = os.environ.get("WORLD_SIZE", "1")
    try:
        world_size = int(value)
    except ValueError:
        raise ValueError(f"WORLD_SIZE must be an integer, but is '{value}' instead.") from None
    if world_size < 1:
        raise ValueError(f"WORLD_SIZE must be at least 1, but is {world_size} instead.")
    return world_size


def setup_gangs(
    device: torch.device | None = None, tp_size: int = 1, timeout: timedelta = timedelta(minutes=5)
) -> Gangs:
    """Set up the gangs of this process.

    Only torchrun's standard variables are read (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
    MASTER_PORT), so the same code runs under torchrun, Slurm wrappers that set them, or
    alone. ``timeout`` bounds every collective, so that a dead peer ends the job instead of
    hanging it.
    """
    device = device or default_device()
    world_size = world_size_from_env()
    if tp_size < 1 or world_size % tp_size != 0:
        raise ValueError(
            f"`gang.tp_size` must be a positive divisor of the world size {world_size}, but is {tp_size} instead."
        )
    if world_size == 1:
        gang = FakeGang(device)
        return Gangs(root=gang, dp=gang, tp=gang)

    if device.type == "cuda":
        torch.cuda.set_device(device)
    root = ProcessGroupGang.init_default(device, timeout)
    dp_size = world_size // tp_size
    mesh = DeviceMesh(device.type, torch.arange(world_size).view(dp_size, tp_size), mesh_dim_names=("dp", "tp"))
    dp = _mesh_gang(mesh, "dp", device)
    tp = _mesh_gang(mesh, "tp", device)
    return Gangs(root=root, dp=dp, tp=tp, mesh=mesh)


def _mesh_gang(mesh: DeviceMesh, dim: str, device: torch.device) -> Gang:
    if mesh.size(mesh.mesh_dim_names.index(dim) if mesh.mesh_dim_names else 0) == 1:
        return FakeGang(device)
    return ProcessGroupGang(mesh.get_group(dim), device)


def _new_gang(partition: list[list[int]], device: torch.device) -> Gang:
    """This process's gang in ``partition`` (lists of global ranks that cover the job), each list made a new
    process group by every process, in order."""
    if len(partition[0]) == 1:
        return FakeGang(device)
    mine = None
    for ranks in partition:
        group = dist.new_group(ranks, backend=backend_for(device))
        if dist.get_rank() in ranks:
            mine = group
    assert mine is not None, "The partition covers every rank of the job."
    return ProcessGroupGang(mine, device)
