"""The README tutorial: a user's own recipe in a folder of their own, trained with `python -m recipes train`.

The two constants below are the tutorial's text: the user's module and their presets file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from recipes.cli import main

LINREG_PY = '''\
"""Linear regression on synthetic data: a recipe of my own."""

from dataclasses import dataclass, field

import torch
from torch import nn

from recipes import RecipeConfig, RecipeContext, RecipeParts, Validation, per_rank_batch_size, register_recipe
from recsys.data.memory import InMemoryReader
from units import EvalUnit, Mean, MetricBag, TrainUnit

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass
class DataSection:
    num_features: int = 8
    num_samples: int = 4096
    batch_size: int = 64  # global: split over the data-parallel ranks
    noise: float = 0.1


@dataclass
class LinRegConfig(RecipeConfig):
    data: DataSection = field(default_factory=DataSection)


class RegressionReader(InMemoryReader[Batch]):
    """This rank's share of (features, targets) batches, reshuffled every epoch."""

    def __init__(self, features: torch.Tensor, targets: torch.Tensor, context: RecipeContext, shuffle: bool) -> None:
        def make_batch(rows: torch.Tensor) -> Batch:
            return features[rows].to(context.device), targets[rows].to(context.device)

        super().__init__(
            make_batch,
            num_samples=len(targets),
            batch_size=per_rank_batch_size(context.config.data.batch_size, context.gangs.dp.size),
            num_accumulate=context.config.trainer.grad_accumulation if shuffle else 1,
            dp_rank=context.gangs.dp.rank,
            dp_size=context.gangs.dp.size,
            shuffle=shuffle,
            seed=context.config.seed,
            drop_last=shuffle,  # validation scores every row, the last partial batch too
        )


class RegressionTrainUnit(TrainUnit[Batch]):
    def __call__(self, batch: Batch) -> tuple[torch.Tensor, int]:
        features, targets = batch
        loss = ((self.model(features).squeeze(1) - targets) ** 2).sum()
        return loss, len(targets)  # The summed loss and the number of targets it sums over.


class RegressionEvalUnit(EvalUnit[Batch]):
    def __init__(self, model: nn.Module, metric_bag: MetricBag) -> None:
        super().__init__(model, metric_bag)
        metric_bag.register("mse", Mean())

    def __call__(self, batch: Batch) -> None:
        features, targets = batch
        errors = (self.model(features).squeeze(1) - targets) ** 2
        self.metric_bag["mse"].update(errors.mean(), weight=len(targets))


@register_recipe("linreg", LinRegConfig, "Linear regression on synthetic data.")
def build_linreg(context: RecipeContext[LinRegConfig]) -> RecipeParts:
    data = context.config.data
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(data.num_samples, data.num_features, generator=generator)
    true_weights = torch.randn(data.num_features, generator=generator)
    targets = features @ true_weights + data.noise * torch.randn(data.num_samples, generator=generator)
    split = data.num_samples * 3 // 4

    model = nn.Linear(data.num_features, 1).to(context.device)
    dp = context.gangs.dp
    return RecipeParts(
        train_unit=RegressionTrainUnit(model, MetricBag(dp)),
        train_reader=RegressionReader(features[:split], targets[:split], context, shuffle=True),
        validations=[
            Validation(
                RegressionEvalUnit(model, MetricBag(dp)),
                RegressionReader(features[split:], targets[split:], context, shuffle=False),
            )
        ],
    )
'''

RECIPES_YAML = """\
linreg_demo:
  recipe: linreg
  description: Linear regression on synthetic data.
  imports: [linreg]
  config:
    trainer:
      max_num_steps: 150
      validate_every_n_steps: 50
      score_metric: mse
      lower_better: true
    optimizer:
      name: sgd
      lr: 0.05
"""


def write_tutorial(folder: Path) -> Path:
    folder.mkdir()
    (folder / "linreg.py").write_text(LINREG_PY)
    (folder / "recipes.yaml").write_text(RECIPES_YAML)
    return folder


def test_the_tutorial_recipe_is_listed_and_trains(tmp_path: Path, run_cli: Any, read_jsonl: Any) -> None:
    project = write_tutorial(tmp_path / "my_project")

    listed = run_cli("list", cwd=project)
    trained = run_cli("train", "linreg_demo", "-o", "out", cwd=project)

    assert listed.returncode == 0, listed.stderr
    assert "linreg_demo" in listed.stdout and "ctr_tiny" in listed.stdout
    assert trained.returncode == 0, trained.stderr
    out = project / "out"
    assert (out / "config.yaml").is_file()
    assert list((out / "tb" / "train").glob("events.out.tfevents.*"))
    train = read_jsonl(out / "metrics" / "train.jsonl")
    valid = read_jsonl(out / "metrics" / "valid.jsonl")
    assert [row["step"] for row in train] == list(range(10, 151, 10))
    assert [row["step"] for row in valid] == [50, 100, 150]
    assert train[-1]["loss"] < train[0]["loss"] / 10
    # The targets' noise has variance 0.01; a fitted line gets close to it.
    assert valid[-1]["mse"] < 0.05


def test_the_tutorial_recipe_takes_overrides_of_its_own_section(
    isolated_presets: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(write_tutorial(isolated_presets / "my_project"))

    shown = main(["show", "linreg_demo", "data.batch_size=32"])
    shown_out = capsys.readouterr().out
    wrong = main(["show", "linreg_demo", "data.batch=32"])
    wrong_err = capsys.readouterr().err

    assert shown == 0
    assert "batch_size: 32" in shown_out and "imports:\n- linreg" in shown_out
    assert wrong == 2
    assert "Did you mean 'data.batch_size'?" in wrong_err


def test_the_readme_shows_the_tutorial_as_tested() -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text()

    assert LINREG_PY in readme
    assert RECIPES_YAML in readme
