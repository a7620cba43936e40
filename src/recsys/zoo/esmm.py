"""ESMM: the Entire Space Multi-task Model (Ma et al., Entire Space Multi-Task Model: An Effective Approach for
Estimating Post-Click Conversion Rate, SIGIR 2018).

A conversion is only seen after a click, so a CVR model trained on the clicked rows alone learns ``P(conversion |
click)`` on the clicked rows' distribution and is served over every impression, where it is biased (sample
selection bias), and it learns from the few clicked rows only (data sparsity). ESMM trains on every impression
instead: a CTR tower gives pCTR and a CVR tower pCVR over the same embeddings, and its two outputs are pCTR and
pCTCVR = pCTR * pCVR, fitted to the click and to the click-and-conversion labels of every row. The CVR tower is
then ``P(conversion | click, x)`` over the whole impression space, learnt through the product, and it shares the
tables that the many clicks train.

So the two tasks of ``dataset.labels`` must be binary columns of every impression: the click, and click AND
conversion (``ctcvr``: 1 only where the row was clicked and converted), as the paper and TorchEasyRec have them,
named by ``click_task`` and ``ctcvr_task``; the model refuses other tasks at start-up. A conversion label that is
empty or 0 on rows without a click is what the ``ctcvr`` column is; a raw conversion column of the clicked rows
only is not.

Its outputs are logits in the tasks' order: pCTR's and pCTCVR's. pCTCVR's logit is ``-logsumexp(-a, -b, -a - b)``
for the towers' logits ``a`` and ``b``, exactly ``logit(sigmoid(a) * sigmoid(b))``, without the probabilities'
rounding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from components import PositiveInt
from recipes import ConfigError
from recsys.click.models import Pooled
from recsys.click.tasks import Task
from recsys.zoo.multitask import ConcatenatedModel, MultiTaskConfig, Towers, input_width
from recsys.zoo.zoo_model import ZOO_MODELS, ModelInputs

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle


@dataclass
class ESMMConfig(MultiTaskConfig):
    """ESMM's options; the towers' defaults are the paper's hidden layers (200, 80)."""

    tower_dims: list[PositiveInt] = field(default_factory=lambda: [200, 80])
    """The hidden layers of the CTR tower and of the CVR tower, each over the concatenated input."""
    click_task: str = "click"
    """The name of the click task in ``dataset.labels``: binary, 1 where the impression was clicked."""
    ctcvr_task: str = "ctcvr"
    """The name of the click-and-conversion task: binary, 1 where the impression was clicked and then converted,
    0 on every other row (clicked or not)."""

    def __post_init__(self) -> None:
        if self.click_task == self.ctcvr_task:
            raise ValueError(f"`click_task` and `ctcvr_task` must be two tasks, but both are '{self.click_task}'.")

    def check_tasks(self, tasks: Sequence[Task]) -> None:
        named = [(task.name, task.kind) for task in tasks]
        if sorted(named) != sorted([(self.click_task, "binary"), (self.ctcvr_task, "binary")]):
            shown = ", ".join(f"'{name}' ({kind})" for name, kind in named)
            raise ConfigError(
                f"The model 'esmm' fits pCTR and pCTCVR over every impression, so `dataset.labels` must be two binary "
                f"tasks, the click '{self.click_task}' and the click-and-conversion '{self.ctcvr_task}' "
                f"(`model.click_task`, `model.ctcvr_task`), but is {shown} instead."
            )


def ctcvr_logit(ctr: torch.Tensor, cvr: torch.Tensor) -> torch.Tensor:
    """``logit(sigmoid(ctr) * sigmoid(cvr))``: the odds of the product are ``1 / (e^-a + e^-b + e^-(a+b))``."""
    return -torch.logsumexp(torch.stack([-ctr, -cvr, -(ctr + cvr)]), dim=0)


class ESMM(ConcatenatedModel):
    """A CTR tower and a CVR tower over the same input; the logits of pCTR and pCTCVR, in the tasks' order."""

    def __init__(
        self,
        embeddings: nn.Module,
        features: list[str],
        num_dense: int,
        width: int,
        config: ESMMConfig,
        click_column: int,
    ) -> None:
        super().__init__(embeddings, features, num_dense)
        self.towers = Towers(width, config.tower_dims, 2, config.dropout)  # towers 0: CTR, 1: CVR.
        self.click_column = click_column

    def tensor_parallel_plan(self) -> dict[str, ParallelStyle]:
        return self.towers.tensor_parallel_plan("towers")

    def cvr_logits(self, dense: torch.Tensor, pooled: Pooled) -> torch.Tensor:
        """The CVR tower's logits ``[B]``: ``P(conversion | click)`` over every impression, which serving a
        conversion model wants (not an output of the model, which has no label for it)."""
        logits: torch.Tensor = self.towers([self.concatenated(dense, pooled)] * 2)[:, 1]
        return logits

    def dense_logits(self, dense: torch.Tensor, pooled: Pooled) -> torch.Tensor:
        x = self.concatenated(dense, pooled)
        ctr, cvr = self.towers([x, x]).unbind(dim=1)
        outputs = [ctr, ctcvr_logit(ctr, cvr)]
        return torch.stack(outputs if self.click_column == 0 else outputs[::-1], dim=1)


@ZOO_MODELS.register("esmm", ESMMConfig)
def esmm(config: ESMMConfig, inputs: ModelInputs) -> nn.Module:
    if not inputs.tasks:
        raise ValueError("ESMM must be built with its `tasks`, to know which is the click, but is given none.")
    config.check_tasks(inputs.tasks)
    click_column = [task.name for task in inputs.tasks].index(config.click_task)
    width = input_width(inputs, config)
    return ESMM(inputs.vectors(config.embeddings), inputs.features, inputs.num_dense, width, config, click_column)
