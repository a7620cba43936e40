"""Gangs: process groups over torch.distributed, and a fake one for a single process."""

from gang.fake import FakeGang
from gang.gang import Gang, GangError, PendingCollective, ReduceOperation
from gang.process_group import ProcessGroupGang
from gang.setup import Gangs, default_device, setup_gangs, world_size_from_env

__all__ = [
    "FakeGang",
    "Gang",
    "GangError",
    "Gangs",
    "PendingCollective",
    "ProcessGroupGang",
    "ReduceOperation",
    "default_device",
    "setup_gangs",
    "world_size_from_env",
]
