"""torch.profiler over a window of training steps, traces under ``OUTPUT_DIR/tb/profiler``."""

from __future__ import annotations

from types import TracebackType

import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler


class Profiler:
    """Skips ``skip_steps`` steps, then records ``record_steps``; inert when disabled.

    The traces are Chrome trace files that TensorBoard's profiler plugin and
    chrome://tracing both open.
    """

    def __init__(self, enabled: bool, skip_steps: int, record_steps: int, trace_dir: str, rank: int) -> None:
        self._profile: profile | None = None
        if enabled:
            activities = [ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(ProfilerActivity.CUDA)
            self._profile = profile(
                activities=activities,
                schedule=schedule(skip_first=skip_steps, wait=0, warmup=1, active=record_steps, repeat=1),
                on_trace_ready=tensorboard_trace_handler(trace_dir, worker_name=f"rank_{rank}"),
                record_shapes=True,
                with_stack=False,
            )

    def __enter__(self) -> Profiler:
        if self._profile is not None:
            self._profile.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._profile is not None:
            self._profile.__exit__(exc_type, exc, tb)

    def step(self) -> None:
        if self._profile is not None:
            self._profile.step()
