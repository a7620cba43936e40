"""The Trainer's loop on a tiny linear regression: accumulation, limits, schedules, NaN policy, early stopping."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from typing import Any

import pytest
import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from gang import FakeGang, Gangs
from recipes.config.sections import TrainerSection
from recipes.errors import UserError
from recipes.recorders import MetricRecorder
from recipes.training.checkpoint_schedule import CheckpointSchedule
from recipes.training.data_reader import DataError
from recipes.training.early_stopping import NOOP_EARLY_STOPPER, PatienceEarlyStopper
from recipes.training.profiler import Profiler
from recipes.training.protocols import NOOP_CHECKPOINTER, Checkpointer, Validation
from recipes.training.score import ScoreMetric
from recipes.training.step_checks import ConfiguredBatchSize
from recipes.training.trainer import LossNotFiniteError, Trainer
from recipes.training.validator import make_validator
from recsys.data.memory import InMemoryReader
from support.linear_regression import (
    FEATURES,
    NUM_FEATURES,
    TARGETS,
    Batch,
    SquaredErrorUnit,
    linear_model,
    reader,
    sequence_validation,
)
from units import EvalUnit, Mean, MetricBag, TrainUnit


class ListRecorder(MetricRecorder):
    def __init__(self) -> None:
        self.records: list[tuple[str, int, dict[str, float]]] = []

    def record(self, run: str, step_nr: int, values: Mapping[str, float]) -> None:
        self.records.append((run, step_nr, dict(values)))

    def steps(self, run: str) -> list[int]:
        return [step for name, step, _ in self.records if name == run]


def make_trainer(
    config: TrainerSection,
    *,
    unit: TrainUnit[Batch] | None = None,
    data: InMemoryReader[Batch] | None = None,
    validations: list[Validation[Any]] | None = None,
    recorder: MetricRecorder | None = None,
    early_stopper: PatienceEarlyStopper | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    checkpointer: Checkpointer | None = None,
    checkpoint_every_n_steps: int | None = 2,
    checkpoint_new_best: bool = False,
    batch_size: ConfiguredBatchSize | None = None,
) -> Trainer[Batch]:
    unit = unit or SquaredErrorUnit(linear_model())
    optimizer = optimizer or torch.optim.SGD(unit.model.parameters(), lr=0.05)
    recorder = recorder or ListRecorder()
    score = None if config.score_metric is None else ScoreMetric(config.score_metric, config.lower_better)
    validator = make_validator(
        validations or [], unit.model, recorder, 0, nullcontext, score, early_stopper or NOOP_EARLY_STOPPER
    )
    gang = FakeGang()
    return Trainer(
        unit=unit,
        data_reader=data or reader(batch_size=8),
        optimizer=optimizer,
        lr_scheduler=LambdaLR(optimizer, lambda step: 1.0),
        gangs=Gangs(root=gang, dp=gang, tp=gang),
        device=torch.device("cpu"),
        config=config,
        recorder=recorder,
        profiler=Profiler(False, 0, 1, "unused", 0),
        validator=validator,
        checkpointer=checkpointer or NOOP_CHECKPOINTER,
        checkpoints=CheckpointSchedule(
            every_n_steps=None if checkpointer is None else checkpoint_every_n_steps, at_new_best=checkpoint_new_best
        ),
        batch_size=batch_size,
    )


def test_accumulating_two_batches_of_b_equals_one_batch_of_2b() -> None:
    accumulated = SquaredErrorUnit(linear_model())
    whole = SquaredErrorUnit(linear_model())
    config = TrainerSection(max_num_steps=5)

    make_trainer(config, unit=accumulated, data=reader(batch_size=4, num_accumulate=2)).run()
    make_trainer(config, unit=whole, data=reader(batch_size=8)).run()

    # The same 5 steps by hand: SGD on the mean squared error of 8 samples at a time.
    expected = linear_model()
    optimizer = torch.optim.SGD(expected.parameters(), lr=0.05)
    for step in range(5):
        rows = slice(8 * step, 8 * step + 8)
        loss = ((expected(FEATURES[rows]).squeeze(1) - TARGETS[rows]) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    for a, b, c in zip(accumulated.model.parameters(), whole.model.parameters(), expected.parameters()):
        torch.testing.assert_close(a, b)
        torch.testing.assert_close(b, c)
    assert not torch.allclose(expected.weight, linear_model().weight), "the steps must have changed the model"


@pytest.mark.parametrize(("num_epochs", "expected_steps"), [(1, 8), (3, 24)])
def test_max_num_data_epochs_stops_after_that_many_passes(num_epochs: int, expected_steps: int) -> None:
    recorder = ListRecorder()
    trainer = make_trainer(
        TrainerSection(max_num_steps=None, max_num_data_epochs=num_epochs, publish_metrics_every_n_steps=100),
        recorder=recorder,
    )

    trainer.run()

    assert trainer.step_nr == expected_steps  # 64 samples / batch 8 = 8 steps per epoch
    assert recorder.records[-1][1] == expected_steps
    assert recorder.records[-1][2]["data_epoch"] == num_epochs


def test_the_step_limit_wins_over_the_epoch_limit_and_epochs_continue() -> None:
    trainer = make_trainer(TrainerSection(max_num_steps=12, max_num_data_epochs=5))

    trainer.run()

    assert trainer.step_nr == 12


@pytest.mark.parametrize(
    ("max_steps", "publish_every", "validate_every", "published", "validated"),
    [
        (7, 3, 2, [3, 6, 7], [2, 4, 6, 7]),
        (6, 3, 2, [3, 6], [2, 4, 6]),  # No second record of the last step.
        (5, 10, None, [5], [5]),  # Without a schedule: once, at the end.
    ],
)
def test_publish_and_validate_at_the_configured_steps_and_at_the_end(
    max_steps: int, publish_every: int, validate_every: int | None, published: list[int], validated: list[int]
) -> None:
    recorder = ListRecorder()
    model = linear_model()
    trainer = make_trainer(
        TrainerSection(
            max_num_steps=max_steps,
            publish_metrics_every_n_steps=publish_every,
            validate_every_n_steps=validate_every,
        ),
        unit=SquaredErrorUnit(model),
        validations=[sequence_validation(model, [float(i) for i in range(10)])],
        recorder=recorder,
    )

    trainer.run()

    assert recorder.steps("train") == published
    assert recorder.steps("valid") == validated
    assert [values["score"] for run, _, values in recorder.records if run == "valid"] == list(
        map(float, range(len(validated)))
    )
    first_train = next(values for run, _, values in recorder.records if run == "train")
    assert {"loss", "throughput", "lr", "data_epoch"} <= set(first_train)
    assert "grad_norm" not in first_train  # Without clipping, no norm is taken.


def test_the_published_loss_is_the_mean_over_the_targets_of_the_published_steps() -> None:
    recorder = ListRecorder()
    make_trainer(TrainerSection(max_num_steps=2, publish_metrics_every_n_steps=2), recorder=recorder).run()

    by_hand = linear_model()
    optimizer = torch.optim.SGD(by_hand.parameters(), lr=0.05)
    losses = []
    for step in range(2):
        rows = slice(8 * step, 8 * step + 8)
        loss = ((by_hand(FEATURES[rows]).squeeze(1) - TARGETS[rows]) ** 2).mean()
        losses.append(float(loss.detach()))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    [(run, step, values)] = recorder.records
    assert (run, step) == ("train", 2)
    assert values["loss"] == pytest.approx(sum(losses) / 2, rel=1e-5)
    assert values["lr"] == 0.05


@pytest.mark.parametrize("score_metric", ["scor", "valid/auc", "other/score"])
def test_a_score_metric_naming_a_missing_metric_is_a_user_error(score_metric: str) -> None:
    model = linear_model()

    with pytest.raises(UserError) as info:
        make_trainer(
            TrainerSection(score_metric=score_metric),
            unit=SquaredErrorUnit(model),
            validations=[sequence_validation(model, [])],
        )

    message = str(info.value)
    assert f"`trainer.score_metric` must name a validation metric (one of valid/score), but is '{score_metric}'" in (
        message
    )


def test_a_misspelt_score_metric_gets_a_hint() -> None:
    model = linear_model()

    with pytest.raises(UserError, match=r"Did you mean 'valid/score'\?"):
        make_trainer(
            TrainerSection(score_metric="scor"),
            unit=SquaredErrorUnit(model),
            validations=[sequence_validation(model, [])],
        )


def test_a_score_metric_without_validations_is_a_user_error() -> None:
    with pytest.raises(UserError, match=r"must name a validation metric \(one of none\), but is 'auc' instead"):
        make_trainer(TrainerSection(score_metric="auc"))


@pytest.mark.parametrize("score_metric", ["score", "valid/score"])
def test_a_score_metric_names_the_metric_alone_or_with_its_unit(score_metric: str) -> None:
    model = linear_model()

    make_trainer(
        TrainerSection(score_metric=score_metric, lower_better=False),
        unit=SquaredErrorUnit(model),
        validations=[sequence_validation(model, [])],
    )


def test_a_nan_loss_with_nan_policy_stop_raises_naming_the_step() -> None:
    trainer = make_trainer(TrainerSection(max_num_steps=10), unit=SquaredErrorUnit(linear_model(), frozenset({3})))

    with pytest.raises(LossNotFiniteError, match=r"The loss is nan at step 3; stopping \(trainer.nan_policy=stop\)"):
        trainer.run()


def test_a_nan_loss_with_nan_policy_skip_skips_the_step_without_touching_the_model() -> None:
    recorder = ListRecorder()
    skipping = SquaredErrorUnit(linear_model(), frozenset({2}))
    trainer = make_trainer(
        TrainerSection(max_num_steps=4, nan_policy="skip", publish_metrics_every_n_steps=1),
        unit=skipping,
        recorder=recorder,
    )

    trainer.run()

    assert trainer.step_nr == 4
    skipped = dict((step, values) for _, step, values in recorder.records)
    assert skipped[2]["num_skipped_steps"] == 1.0 and "loss" not in skipped[2]
    assert skipped[3]["num_skipped_steps"] == 0.0
    # The skipped step changed nothing: 3 real steps on batches 1, 3 and 4 give the same model.
    by_hand = linear_model()
    optimizer = torch.optim.SGD(by_hand.parameters(), lr=0.05)
    for step in (0, 2, 3):
        rows = slice(8 * step, 8 * step + 8)
        optimizer.zero_grad()
        ((by_hand(FEATURES[rows]).squeeze(1) - TARGETS[rows]) ** 2).mean().backward()
        optimizer.step()
    for actual, expected in zip(skipping.model.parameters(), by_hand.parameters()):
        torch.testing.assert_close(actual, expected)


def test_too_many_skipped_steps_in_a_row_stop_training() -> None:
    unit = SquaredErrorUnit(linear_model(), frozenset({2, 4, 5, 6, 7}))
    trainer = make_trainer(
        TrainerSection(max_num_steps=20, nan_policy="skip", max_consecutive_skipped_steps=3), unit=unit
    )

    with pytest.raises(LossNotFiniteError, match=r"not finite for 3 steps in a row \(up to step 6\)"):
        trainer.run()


@pytest.mark.parametrize(
    ("scores", "lower_better", "stop_step"),
    [
        ([0.5, 0.6, 0.55, 0.58, 0.9, 0.9], False, 8),  # two validations without a new best after 0.6
        ([0.5, 0.4, 0.3, 0.2, 0.1, 0.05], False, 6),
        ([0.5, 0.4, 0.3, 0.2, 0.1, 0.05], True, 12),  # always improving: runs to max_num_steps
    ],
)
def test_early_stopping_stops_at_the_expected_validation(
    scores: list[float], lower_better: bool, stop_step: int
) -> None:
    recorder = ListRecorder()
    model = linear_model()
    trainer = make_trainer(
        TrainerSection(max_num_steps=12, validate_every_n_steps=2, score_metric="score", lower_better=lower_better),
        unit=SquaredErrorUnit(model),
        validations=[sequence_validation(model, scores)],
        recorder=recorder,
        early_stopper=PatienceEarlyStopper(2, lower_better=lower_better),
    )

    trainer.run()

    assert trainer.step_nr == stop_step
    assert recorder.steps("valid") == list(range(2, stop_step + 1, 2))
    assert recorder.steps("train")[-1] == stop_step


def test_bf16_mixed_precision_trains_on_cpu() -> None:
    recorder = ListRecorder()
    model = linear_model()
    before = model.weight.detach().clone()

    make_trainer(
        TrainerSection(max_num_steps=8, mixed_precision="bf16", publish_metrics_every_n_steps=4),
        unit=SquaredErrorUnit(model),
        recorder=recorder,
    ).run()

    losses = [values["loss"] for _, _, values in recorder.records]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[1] < losses[0]
    assert model.weight.dtype == torch.float32  # autocast, not a cast of the model
    assert not torch.equal(model.weight, before)


def test_clipping_scales_the_mean_gradient_to_the_limit_and_records_the_norm_before() -> None:
    """One step of SGD (lr 0.05) on one batch of 8 rows, against the hand-computed clipped update."""
    recorder = ListRecorder()
    unit = SquaredErrorUnit(linear_model())
    trainer = make_trainer(
        TrainerSection(max_num_steps=1, publish_metrics_every_n_steps=1, max_grad_norm=0.01),
        unit=unit,
        recorder=recorder,
    )
    model = linear_model()
    loss = ((model(FEATURES[:8]).squeeze(1) - TARGETS[:8]) ** 2).mean()
    loss.backward()
    grads = [param.grad for param in model.parameters()]
    norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))

    trainer.run()

    (values,) = [values for run, _, values in recorder.records if run == "train"]
    assert values["grad_norm"] == pytest.approx(norm, rel=1e-5)
    assert norm > 0.01
    for param, start, grad in zip(unit.model.parameters(), model.parameters(), grads):
        torch.testing.assert_close(param.detach(), start.detach() - 0.05 * grad * (0.01 / norm))


class PromiseCheckingCheckpointer:
    """Records which tensors each save may copy late, and checks at ``wait_until_staged`` that they are unchanged."""

    def __init__(self) -> None:
        self.late_model_entries: list[set[str]] = []
        self.num_late_optimizer_tensors: list[int] = []
        self.num_waits = 0
        self._promised: list[tuple[torch.Tensor, torch.Tensor]] = []

    def save(
        self,
        step_nr: int,
        score: float | None,
        shared_state: dict[str, Any],
        rank_state: dict[str, Any],
        last: bool,
        unchanged_until_staged: Callable[[torch.Tensor], bool],
        interrupted: bool = False,
        base_step: int | None = None,
    ) -> None:
        model = shared_state["model"]
        self.late_model_entries.append({name for name, value in model.items() if unchanged_until_staged(value)})
        optimizer_tensors = [v for state in shared_state["optimizer"]["state"].values() for v in state.values()]
        self.num_late_optimizer_tensors.append(sum(map(unchanged_until_staged, optimizer_tensors)))
        assert not unchanged_until_staged(rank_state["rng"]["torch"])
        self._promised = [(t, t.clone()) for t in [*model.values(), *optimizer_tensors] if unchanged_until_staged(t)]

    def wait_until_staged(self) -> None:
        self.num_waits += 1
        for live, at_save in self._promised:
            assert torch.equal(live, at_save), "a tensor promised unchanged changed before wait_until_staged"
        self._promised = []

    def delta_base(self, step_nr: int) -> int | None:
        return None


def test_what_an_async_save_may_copy_late_stays_unchanged_until_the_trainer_waits_for_it() -> None:
    """Parameters and optimizer state change only in the optimizer step, before which the Trainer waits;
    buffers (changed by the forward pass) and RNG states are never left to a late copy."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(NUM_FEATURES, 1), nn.BatchNorm1d(1))
    checkpointer = PromiseCheckingCheckpointer()
    trainer = make_trainer(
        TrainerSection(max_num_steps=6),
        unit=SquaredErrorUnit(model),
        optimizer=torch.optim.Adam(model.parameters(), lr=0.01),
        checkpointer=checkpointer,
    )

    trainer.run()

    parameters = {"0.weight", "0.bias", "1.weight", "1.bias"}
    assert checkpointer.late_model_entries == [parameters] * 3  # Steps 2, 4 and 6.
    assert checkpointer.num_late_optimizer_tensors == [3 * 4] * 3  # step, exp_avg, exp_avg_sq of each.
    assert checkpointer.num_waits == 6


# Data that fills no step -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("batch_size", "num_accumulate", "max_steps", "max_epochs", "step_rows"),
    [
        (16, 1, 5, None, "a step takes 16 rows (`batch_size` 16 per rank x 1 micro-batches"),  # a batch too big
        (8, 2, 5, None, "a step takes 16 rows (`batch_size` 8 per rank x 2 micro-batches"),  # too much accumulation
        (16, 1, None, 1, "a step takes 16 rows"),  # one epoch of nothing: once 0 steps and a checkpoint of step 0
    ],
    ids=["a_batch_larger_than_the_data", "too_much_accumulation", "one_epoch_of_nothing"],
)
def test_data_that_fills_no_step_stops_naming_its_rows_and_the_rows_of_a_step(
    batch_size: int, num_accumulate: int, max_steps: int | None, max_epochs: int | None, step_rows: str
) -> None:
    trainer = make_trainer(
        TrainerSection(max_num_steps=max_steps, max_num_data_epochs=max_epochs),
        data=reader(batch_size=batch_size, num_accumulate=num_accumulate, num_samples=8),
    )

    with pytest.raises(DataError) as raised:
        trainer.run()

    message = str(raised.value)
    assert message.startswith("The training data fills no step of a data epoch (8 samples in memory; "), message
    assert step_rows in message
    assert message.endswith("is it empty, or smaller than one step?")
    assert trainer.step_nr == 0


# A stop on request ---------------------------------------------------------------------------


class RecordingCheckpointer:
    """Keeps a copy of what each save holds, as a checkpoint would, with its flags."""

    def __init__(self) -> None:
        self.saves: list[tuple[int, bool, bool]] = []  # (step, last, interrupted)
        self.states: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}

    def save(
        self,
        step_nr: int,
        score: float | None,
        shared_state: dict[str, Any],
        rank_state: dict[str, Any],
        last: bool,
        unchanged_until_staged: Callable[[torch.Tensor], bool],
        interrupted: bool = False,
        base_step: int | None = None,
    ) -> None:
        self.saves.append((step_nr, last, interrupted))
        self.states[step_nr] = (copy.deepcopy(shared_state), copy.deepcopy(rank_state))

    def wait_until_staged(self) -> None:
        pass

    def delta_base(self, step_nr: int) -> int | None:
        return None


class StoppedAtUnit(SquaredErrorUnit):
    """Asks its trainer to stop during step ``stop_at``, as the signal handler does."""

    def __init__(self, model: nn.Module, stop_at: int | None) -> None:
        super().__init__(model)
        self.stop_at = stop_at
        self.trainer: Trainer[Batch] | None = None

    def __call__(self, batch: Batch) -> torch.Tensor:
        if self.step_nr == self.stop_at and self.trainer is not None:
            self.trainer.request_stop()
        return super().__call__(batch)


class ErrorEvalUnit(EvalUnit[Batch]):
    """``score``: the model's mean squared error, so that it depends on the training alone."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model, MetricBag(FakeGang()))
        self.metric_bag.register("score", Mean())

    def __call__(self, batch: Batch) -> None:
        features, targets = batch
        self.metric_bag["score"].update(((self.model(features).squeeze(1) - targets) ** 2).mean().detach())


def early_stopping_trainer(
    stop_at: int | None, recorder: ListRecorder, checkpointer: RecordingCheckpointer
) -> Trainer[Batch]:
    """Validates every 4 steps; the error falls at each, which `lower_better=False` takes for a worse score: with a
    patience of 2, the run stops early at step 12 (best at step 4)."""
    model = linear_model()
    unit = StoppedAtUnit(model, stop_at)
    trainer = make_trainer(
        TrainerSection(
            max_num_steps=40,
            validate_every_n_steps=4,
            publish_metrics_every_n_steps=4,
            score_metric="score",
            lower_better=False,
        ),
        unit=unit,
        validations=[Validation(ErrorEvalUnit(model), reader(batch_size=8))],
        recorder=recorder,
        early_stopper=PatienceEarlyStopper(2, lower_better=False),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5),  # State that a resume must load.
        checkpointer=checkpointer,
    )
    unit.trainer = trainer
    return trainer


def test_a_stop_on_request_publishes_and_validates_nothing_and_saves_a_resume_point_only() -> None:
    recorder, checkpointer = ListRecorder(), RecordingCheckpointer()
    trainer = early_stopping_trainer(5, recorder, checkpointer)

    trainer.run()

    assert trainer.step_nr == 5
    assert recorder.steps("train") == [4]
    assert recorder.steps("valid") == [4]
    assert checkpointer.saves == [(2, False, False), (4, False, False), (5, True, True)]


def test_a_run_stopped_on_request_and_resumed_ends_as_the_run_never_stopped() -> None:
    """With early stopping, the stop's validation counted as one without a new best: the resumed run stopped at
    step 8 rather than 12 (issue 31)."""
    reference_recorder = ListRecorder()
    reference = early_stopping_trainer(None, reference_recorder, RecordingCheckpointer())
    reference.run()
    assert reference.step_nr == 12

    checkpointer = RecordingCheckpointer()
    early_stopping_trainer(5, ListRecorder(), checkpointer).run()
    shared, own = checkpointer.states[5]
    recorder = ListRecorder()
    resumed = early_stopping_trainer(None, recorder, RecordingCheckpointer())
    resumed.load_state(shared, own, [own])
    resumed.run()

    assert resumed.step_nr == reference.step_nr
    assert recorder.steps("valid") == [8, 12]
    expected = [values for run, step, values in reference_recorder.records if run == "valid" and step > 5]
    assert [values for run, _, values in recorder.records if run == "valid"] == expected
    assert resumed.state.shared()["model"].keys() == reference.state.shared()["model"].keys()
    for name, value in reference.state.shared()["model"].items():
        torch.testing.assert_close(resumed.state.shared()["model"][name], value)


@pytest.mark.parametrize("lower_better", [False, True])
def test_with_keep_best_a_validation_that_beats_the_best_is_checkpointed_between_the_periods(
    lower_better: bool,
) -> None:
    """Validations every 2 steps, checkpoints every 6: the best checkpoint must be the best validation's step."""
    model = linear_model()
    scores = [0.5, 0.7, 0.6, 0.9, 0.8, 0.4] if not lower_better else [0.5, 0.3, 0.4, 0.1, 0.2, 0.6]
    checkpointer = RecordingCheckpointer()
    trainer = make_trainer(
        TrainerSection(max_num_steps=12, validate_every_n_steps=2, score_metric="score", lower_better=lower_better),
        unit=SquaredErrorUnit(model),
        validations=[sequence_validation(model, scores)],
        checkpointer=checkpointer,
        checkpoint_every_n_steps=6,
        checkpoint_new_best=True,
    )

    trainer.run()

    # New bests at steps 2, 4 and 8; the periods add 6 and 12 (the last).
    assert [step for step, _, _ in checkpointer.saves] == [2, 4, 6, 8, 12]
    assert trainer.state.counters.best_score == pytest.approx(0.1 if lower_better else 0.9)
