"""The train unit's contract and the first step's checks, in one process: a unit that reduces its loss itself, a
reader whose batches are not the configured size, a unit built without its base's ``__init__``; and the
``GlobalBatchSize`` type by which the framework knows a recipe's train batch size."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from gang import FakeGang
from recipes import GlobalBatchSize
from recipes.config.resolution import resolve_config
from recipes.config.sections import RecipeConfig, TrainerSection
from recipes.errors import ConfigError, UserError
from recipes.training.batch_size import configured_batch_size
from recipes.training.parts import RecipeParts, check_units
from recipes.training.protocols import Validation
from recipes.training.step_checks import ConfiguredBatchSize
from support.cli_runs import assert_one_line_error, run_main
from support.linear_regression import FEATURES, TARGETS, Batch, SquaredErrorUnit, linear_model, reader
from unit.recipes.test_trainer import make_trainer
from units import EvalUnit, MetricBag, TrainUnit


class ReducingUnit(TrainUnit[Batch]):
    """The squared error of each target, made into what ``reduce`` returns: a unit that reduces its loss itself."""

    def __init__(self, reduce: Callable[[torch.Tensor], Any]) -> None:
        super().__init__(linear_model(), MetricBag(FakeGang()))
        self._reduce = reduce

    def __call__(self, batch: Batch) -> torch.Tensor:
        features, targets = batch
        reduced: torch.Tensor = self._reduce((self.model(features).squeeze(1) - targets) ** 2)
        return reduced


def run_refused(unit: TrainUnit[Batch], **trainer_options: Any) -> str:
    """The one-line error of a run of ``unit`` that must stop at its first step, having changed no weight."""
    before = copy.deepcopy(unit.model.state_dict())
    with pytest.raises(UserError) as raised:
        make_trainer(TrainerSection(max_num_steps=3), unit=unit, **trainer_options).run()
    after = unit.model.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before), "no optimizer step may have run"
    message = str(raised.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("reduce", "returned"),
    [
        (torch.mean, "returned a 0-dim loss (a mean or a sum"),
        (torch.sum, "returned a 0-dim loss (a mean or a sum"),
        (lambda loss: (loss.sum(), len(loss)), "returned a tuple"),  # the contract of old
        (lambda loss: loss.detach().sum().item(), "returned a float"),
    ],
)
def test_a_unit_that_reduces_its_loss_is_refused_at_the_first_step_saying_what_to_return(
    reduce: Callable[[torch.Tensor], Any], returned: str
) -> None:
    message = run_refused(ReducingUnit(reduce))

    assert f"The train unit ReducingUnit {returned}" in message
    assert "a TrainUnit returns the unreduced loss, one element per target" in message
    assert '(`binary_cross_entropy_with_logits(logits, labels, reduction="none")`)' in message


def test_a_masked_loss_trains_on_the_mean_of_the_targets_it_keeps() -> None:
    unit = ReducingUnit(lambda loss: loss[loss > 1.0])
    make_trainer(TrainerSection(max_num_steps=1), unit=unit).run()

    expected = linear_model()
    errors = (expected(FEATURES[:8]).squeeze(1) - TARGETS[:8]) ** 2
    errors[errors > 1.0].mean().backward()
    torch.optim.SGD(expected.parameters(), lr=0.05).step()
    torch.testing.assert_close(unit.model.weight, expected.weight)
    torch.testing.assert_close(unit.model.bias, expected.bias)


def test_batches_other_than_the_configured_size_are_refused_at_the_first_step_naming_the_key() -> None:
    message = run_refused(
        SquaredErrorUnit(linear_model()),
        data=reader(batch_size=8),
        batch_size=ConfiguredBatchSize("data.batch_size", 16),
    )

    assert message.startswith(
        "At the first step, the train loss has the wrong number of rows a micro-batch (rank 0: 8)"
    )
    assert "`data.batch_size`=16 over 1 data-parallel rank(s) makes 16" in message
    assert "`per_rank_batch_size(config.data.batch_size, context.gangs.dp.size)`" in message


def test_a_mean_kept_as_one_row_is_refused_where_the_batch_size_is_known() -> None:
    message = run_refused(
        ReducingUnit(lambda loss: loss.mean(0, keepdim=True)),
        data=reader(batch_size=8),
        batch_size=ConfiguredBatchSize("data.batch_size", 8),
    )

    assert "(rank 0: 1)" in message and "the train unit return one loss row per batch row" in message


def test_micro_batches_of_the_configured_size_train() -> None:
    trainer = make_trainer(
        TrainerSection(max_num_steps=3),
        data=reader(batch_size=4, num_accumulate=2),
        batch_size=ConfiguredBatchSize("data.batch_size", 4),
    )

    trainer.run()

    assert trainer.step_nr == 3


# GlobalBatchSize -----------------------------------------------------------------------------


@dataclass
class DataSection:
    batch_size: GlobalBatchSize = 64


@dataclass
class GlobalBatchConfig(RecipeConfig):
    data: DataSection = field(default_factory=DataSection)


@dataclass
class TwoBatchSizesConfig(GlobalBatchConfig):
    batch_size: GlobalBatchSize = 32


def test_the_train_batch_size_is_found_by_its_type_under_its_key() -> None:
    config = resolve_config(GlobalBatchConfig, [("the command line", {"data": {"batch_size": 128}})])

    assert configured_batch_size(config) == ConfiguredBatchSize("data.batch_size", 128)
    assert configured_batch_size(RecipeConfig()) is None


def test_a_global_batch_size_is_a_positive_int_to_the_config() -> None:
    with pytest.raises(ConfigError, match=r"data\.batch_size"):
        resolve_config(GlobalBatchConfig, [("the command line", {"data": {"batch_size": 0}})])


def test_a_config_with_two_train_batch_sizes_is_refused() -> None:
    with pytest.raises(UserError, match=r"but `data\.batch_size`, `batch_size` are\."):
        configured_batch_size(TwoBatchSizesConfig())


def test_a_batch_size_that_the_ranks_do_not_divide_is_refused_by_its_key() -> None:
    with pytest.raises(
        ConfigError, match=r"`data.batch_size` must be a multiple of the 3 data-parallel ranks, but is 64"
    ):
        ConfiguredBatchSize("data.batch_size", 64).per_rank(3)


# Units built without their base's __init__ ------------------------------------------------------


class ForgetfulTrainUnit(SquaredErrorUnit):
    def __init__(self, model: nn.Module) -> None:  # forgets super().__init__
        self.weights = model


class ForgetfulEvalUnit(EvalUnit[Batch]):
    def __init__(self, model: nn.Module) -> None:  # forgets super().__init__
        self.weights = model

    def __call__(self, batch: Batch) -> None:
        pass


def parts(train_unit: Any, eval_unit: Any = None) -> RecipeParts:
    validations = [] if eval_unit is None else [Validation(eval_unit, reader(batch_size=8))]
    return RecipeParts(train_unit=train_unit, train_reader=reader(batch_size=8), validations=validations)


@pytest.mark.parametrize(
    ("built", "message"),
    [
        (
            lambda model: parts(ForgetfulTrainUnit(model)),
            "The TrainUnit ForgetfulTrainUnit (`RecipeParts.train_unit`) is not set up: its __init__ must call "
            "`super().__init__(model, metric_bag)`.",
        ),
        (
            lambda model: parts(SquaredErrorUnit(model), ForgetfulEvalUnit(model)),
            "The EvalUnit ForgetfulEvalUnit (`RecipeParts.validations[0].unit`) is not set up: its __init__ must "
            "call `super().__init__(model, metric_bag, name)`.",
        ),
        (
            lambda model: parts(model),
            "`RecipeParts.train_unit` must be a TrainUnit, but is a Linear instead.",
        ),
    ],
)
def test_units_not_set_up_by_their_base_are_refused_naming_what_to_call(
    built: Callable[[nn.Module], RecipeParts], message: str
) -> None:
    with pytest.raises(UserError) as raised:
        check_units(built(linear_model()))

    assert str(raised.value) == message


FORGETFUL_RECIPE = """\
from recipes import RecipeConfig, RecipeParts, Validation, register_recipe
from support.linear_regression import SquaredErrorUnit, linear_model, reader
from units import EvalUnit


class MSEUnit(EvalUnit):
    def __init__(self, model):
        self.weights = model  # no super().__init__(model, metric_bag)

    def __call__(self, batch):
        pass


@register_recipe("forgetful", RecipeConfig)
def build(context):
    model = linear_model()
    return RecipeParts(SquaredErrorUnit(model), reader(8), [Validation(MSEUnit(model), reader(8))])
"""


def test_training_a_recipe_whose_eval_unit_forgot_its_base_init_stops_at_start_up_in_one_line(
    isolated_presets: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (isolated_presets / "forgetful.py").write_text(FORGETFUL_RECIPE)
    (isolated_presets / "recipes.yaml").write_text("forgetful:\n  recipe: forgetful\n  imports: [forgetful]\n")

    code, _, err = run_main(capsys, "train", "forgetful", "-o", "out")

    assert code == 2
    assert_one_line_error(err, "The EvalUnit MSEUnit (`RecipeParts.validations[0].unit`) is not set up")
    assert not (isolated_presets / "out" / "checkpoints").exists()
