"""What the Trainer costs: samples/s of ``dlrm_criteo_tiny`` through the Trainer vs a hand-written loop.

Both sides train the same model through the same TrainUnit with the same optimizer and LR
scheduler: read a batch, forward, summed BCE, backward, normalisation by the number of targets,
optimizer and LR scheduler step. The Trainer adds what it always does (metric bags, NaN check,
stop-request agreement, publishing to no recorder once per round); validation, checkpoints and
gradient clipping (and so the gradient norm) are off, as in the preset.

The two sides take turns step by step: each time the Trainer pulls a batch, one step of the
hand-written loop runs (timed on its own) before the Trainer gets it. On this shared machine
the speed of the same code drifts by 10-15% from one second to the next, so rounds of whole
runs, one side after the other, measured mostly that drift; a step of each side, one after the
other, see the same machine. Each side reads its own copy of the data through its own reader,
so both parse the same windows of the file at the same steps. A round is one data epoch of the
Trainer; its cost is the median over rounds of its time per step (its run, less the loop's steps
inside it) over the loop's time per step in the same round.

    python benchmarks/trainer_overhead.py [--rounds 20]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

import torch

from gang import FakeGang, Gangs
from recipes.cli.job import ResolvedJob, resolve_job
from recipes.cli.job_spec import JobSpec
from recipes.lr_schedules import build_lr_scheduler
from recipes.optimizers import build_optimizer
from recipes.recorders import CompositeRecorder
from recipes.runtime.rng import seed_everything
from recipes.training.data_reader import DataReader
from recipes.training.parts import RecipeContext, RecipeParts
from recipes.training.profiler import Profiler
from recipes.training.sparse_tables import find_sparse_tables, with_sparse_tables
from recipes.training.trainer import Trainer
from recsys.builtin.dlrm.recipe import DLRMConfig

GANGS = Gangs(FakeGang(), FakeGang(), FakeGang())


def build_parts(job: ResolvedJob, output_dir: str) -> RecipeParts:
    """The recipe's model, units and readers, freshly seeded."""
    seed_everything(job.config.seed)
    parts: RecipeParts = job.recipe.build(RecipeContext(job.config, GANGS, torch.device("cpu"), output_dir))
    return parts


class HandWrittenLoop:
    """A plain PyTorch training loop, run one step at a time, that adds up the time its steps take."""

    def __init__(self, parts: RecipeParts, reader: DataReader[Any], optimizer: torch.optim.Optimizer, scheduler: Any):
        self._unit, self._reader = parts.train_unit, reader
        self._optimizer, self._scheduler = optimizer, scheduler
        self.seconds = 0.0
        self.steps = 0

    def step(self) -> None:
        start = time.perf_counter()
        try:
            batches = next(self._reader)
        except StopIteration:
            self._reader.reset()
            batches = next(self._reader)
        num_targets = 0
        for batch in batches:
            loss = self._unit(batch)  # The same loss and unit metrics as the Trainer's.
            loss.sum().backward()
            num_targets += loss.numel()
        for group in self._optimizer.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    param.grad.div_(num_targets)
        self._optimizer.scale_sparse_gradients(1.0 / num_targets)  # type: ignore[attr-defined]
        self._optimizer.step()
        self._scheduler.step()
        self._optimizer.zero_grad(set_to_none=True)
        self.seconds += time.perf_counter() - start
        self.steps += 1


class TakingTurns(DataReader[Any]):
    """The Trainer's reader, which runs ``other_step`` each time the Trainer asks for a batch.

    The other step runs before the batch is read, so that each side computes on a batch it
    has just read; read first, the Trainer's batch was out of the caches by the time it
    was used, which cost the Trainer about 0.6% in this benchmark.
    """

    def __init__(self, reader: DataReader[Any], other_step: Callable[[], None]) -> None:
        self._reader, self._other_step = reader, other_step

    def __next__(self) -> list[Any]:
        self._other_step()
        return next(self._reader)

    def reset(self) -> None:
        self._reader.reset()

    def state_dict(self) -> dict[str, Any]:
        return self._reader.state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self._reader.load_state_dict(state_dict)


def steps_per_epoch(reader: DataReader[Any]) -> int:
    """The number of steps in one epoch of ``reader``, read (untimed) and then reset."""
    steps = sum(1 for _ in reader)
    reader.reset()
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as output_dir:
        job = resolve_job(JobSpec("dlrm_criteo_tiny", output_dir, overrides=["trainer.score_metric=null"]))
        batch_size = cast(DLRMConfig, job.config).dataset.batch_size
        parts = build_parts(job, output_dir)
        loop_reader = build_parts(job, output_dir).train_reader  # The rest of these parts is dropped.
        steps = steps_per_epoch(parts.train_reader)
        steps_per_epoch(loop_reader)  # Reads the file once more, as the first pass did for the Trainer's reader.
        trainer_config = dataclasses.replace(
            job.config.trainer, max_num_steps=steps, publish_metrics_every_n_steps=steps
        )

        model = parts.train_unit.model
        dense = build_optimizer(job.config.optimizer, model.parameters())
        optimizer = with_sparse_tables(dense, find_sparse_tables(model))  # as the framework wires a recipe's tables
        # The LR schedule spans every step that either side takes.
        scheduler = build_lr_scheduler(job.config.lr_scheduler, optimizer, 2 * steps * (args.rounds + 1))
        loop = HandWrittenLoop(parts, loop_reader, optimizer, scheduler)
        reader = TakingTurns(parts.train_reader, loop.step)

        trainer_rates, loop_rates, time_ratios = [], [], []
        for round_nr in range(args.rounds + 1):  # Round 0 warms up (numba compilation, caches).
            trainer = Trainer(
                unit=parts.train_unit,
                data_reader=reader,
                optimizer=optimizer,
                lr_scheduler=scheduler,
                gangs=GANGS,
                device=torch.device("cpu"),
                config=trainer_config,
                recorder=CompositeRecorder([]),
                profiler=Profiler(False, 0, 1, output_dir, 0),
            )
            reader.reset()  # Each round is a data epoch from its start: the Trainer stops at its max_num_steps.
            gc.collect()  # Not to charge the Trainer with collecting what building it left.
            loop.seconds, loop.steps = 0.0, 0
            start = time.perf_counter()
            trainer.run()
            trainer_seconds = time.perf_counter() - start - loop.seconds
            if round_nr > 0:
                # The loop also takes a step when the Trainer's pull ends the epoch: one more.
                trainer_rates.append(steps * batch_size / trainer_seconds)
                loop_rates.append(loop.steps * batch_size / loop.seconds)
                time_ratios.append((trainer_seconds / steps) / (loop.seconds / loop.steps))

    print(
        f"dlrm_criteo_tiny, {steps} steps (one data epoch) per side x {args.rounds} rounds, batch {batch_size}, "
        f"torch threads {torch.get_num_threads()}"
    )
    print("| side | median samples/s | IQR samples/s |")
    print("| --- | ---: | ---: |")
    for side, rates in (("hand-written loop", loop_rates), ("Trainer", trainer_rates)):
        low, median, high = statistics.quantiles(rates, n=4)
        print(f"| {side} | {median:,.0f} | {low:,.0f}-{high:,.0f} |")
    low, median, high = statistics.quantiles(time_ratios, n=4)
    print(f"Trainer time over loop time per step in the same round: median {median:.4f} (IQR {low:.4f}-{high:.4f})")
    print(f"Trainer cost: {100 * (median - 1):.1f}% (goal: at most 3%)")


if __name__ == "__main__":
    main()
