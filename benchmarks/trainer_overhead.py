"""What the Trainer costs: samples/s of ``dlrm_criteo_tiny`` through the Trainer vs a hand-written loop.

Both sides train the same model through the same TrainUnit on the same reader with the same
optimizer: forward, summed BCE, backward, normalisation by the number of targets, optimizer and LR
scheduler step.
The Trainer adds what it always does (metric bags, NaN check, stop-request agreement, publishing
to no recorder); validation and checkpoints are off on both sides, and only the training loop
is timed. The two alternate, several rounds each, in one process, taking turns at going first;
medians are reported.

    python benchmarks/trainer_overhead.py [--steps 100] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any, cast

import torch

from gang import FakeGang, Gangs
from recipes.builtin.dlrm import DLRMConfig
from recipes.parts import RecipeContext, RecipeParts, build_lr_scheduler
from recipes.profiler import Profiler
from recipes.recorders import CompositeRecorder
from recipes.rng import seed_everything
from recipes.run import JobSpec, ResolvedJob, resolve_job
from recipes.trainer import Trainer

GANGS = Gangs(FakeGang(), FakeGang(), FakeGang())


def build_parts(job: ResolvedJob, output_dir: str) -> tuple[RecipeParts, torch.optim.Optimizer, Any]:
    """The recipe's model, units and reader, its optimizer and LR scheduler, freshly seeded."""
    seed_everything(job.config.seed)
    parts: RecipeParts = job.recipe.build(RecipeContext(job.config, GANGS, torch.device("cpu"), output_dir))
    assert parts.make_optimizer is not None
    optimizer = parts.make_optimizer(parts.train_unit.model)
    scheduler = build_lr_scheduler(job.config.lr_scheduler, optimizer, job.config.trainer.max_num_steps)
    return parts, optimizer, scheduler


def time_trainer(job: ResolvedJob, output_dir: str) -> float:
    """Seconds for ``Trainer.run()``; building the parts is not timed."""
    parts, optimizer, scheduler = build_parts(job, output_dir)
    trainer = Trainer(
        unit=parts.train_unit,
        data_reader=parts.train_reader,
        optimizer=optimizer,
        lr_scheduler=scheduler,
        gangs=GANGS,
        device=torch.device("cpu"),
        config=job.config.trainer,
        recorder=CompositeRecorder([]),
        profiler=Profiler(False, 0, 1, output_dir, 0),
    )
    start = time.perf_counter()
    trainer.run()
    return time.perf_counter() - start


def time_hand_written_loop(job: ResolvedJob, output_dir: str, steps: int) -> float:
    """Seconds for the plain PyTorch loop over the same parts; building them is not timed."""
    parts, optimizer, scheduler = build_parts(job, output_dir)
    unit, reader = parts.train_unit, parts.train_reader
    start = time.perf_counter()
    for _ in range(steps):
        try:
            batches = next(reader)
        except StopIteration:
            reader.reset()
            batches = next(reader)
        num_targets = 0
        for batch in batches:
            loss, batch_targets = unit(batch)  # The same loss and unit metrics as the Trainer's.
            loss.backward()
            num_targets += batch_targets
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    param.grad.div_(num_targets)
        optimizer.scale_sparse_gradients(1.0 / num_targets)  # type: ignore[attr-defined]
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    overrides = [
        f"trainer.max_num_steps={args.steps}",
        f"trainer.publish_metrics_every_n_steps={args.steps}",
        "trainer.score_metric=null",
    ]
    with tempfile.TemporaryDirectory() as output_dir:
        job = resolve_job(JobSpec("dlrm_criteo_tiny", output_dir, overrides=overrides))
        batch_size = cast(DLRMConfig, job.config).dataset.batch_size
        trainer_rates, loop_rates = [], []
        for round_nr in range(args.rounds + 1):  # Round 0 warms up (data files, numba compilation, caches).
            # The side that runs first in a round runs right after the last round's parts were
            # freed; taking turns at going first keeps that from favouring either side.
            if round_nr % 2 == 0:
                trainer_seconds = time_trainer(job, output_dir)
                loop_seconds = time_hand_written_loop(job, output_dir, args.steps)
            else:
                loop_seconds = time_hand_written_loop(job, output_dir, args.steps)
                trainer_seconds = time_trainer(job, output_dir)
            trainer_rate = args.steps * batch_size / trainer_seconds
            loop_rate = args.steps * batch_size / loop_seconds
            if round_nr > 0:
                trainer_rates.append(trainer_rate)
                loop_rates.append(loop_rate)

    trainer_median, loop_median = statistics.median(trainer_rates), statistics.median(loop_rates)
    print(
        f"dlrm_criteo_tiny, {args.steps} steps x {args.rounds} rounds, batch {batch_size}, torch threads "
        f"{torch.get_num_threads()}"
    )
    print("| side | median samples/s | runs |")
    print("| --- | ---: | --- |")
    print(f"| hand-written loop | {loop_median:,.0f} | {', '.join(f'{r:,.0f}' for r in loop_rates)} |")
    print(f"| Trainer | {trainer_median:,.0f} | {', '.join(f'{r:,.0f}' for r in trainer_rates)} |")
    print(f"Trainer cost: {100 * (1 - trainer_median / loop_median):.1f}% (goal: at most 3%)")


if __name__ == "__main__":
    main()
