"""Build the root, data-parallel and tensor-parallel gangs of a job from torchrun's environment."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
from torch.distributed.device_mesh import DeviceMesh

from gang.fake import FakeGang
from gang.gang import Gang
from gang.process_group import ProcessGroupGang


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
