"""How the zoo's models split over the TP gang (``tensor_parallel_plan``): Megatron-LM's pairs of linear layers, the
first split by its outputs (column-wise), the second by its inputs (row-wise), so that a pair costs one all-reduce
and what leaves it is whole again on every rank.

A pair's hidden width is split in equal shares: torch splits a width the gang does not divide into unequal shards,
which the row-wise layer then cannot multiply (its sharding propagation fails at the first forward, in a page of
torch's trace). So each column-wise layer checks its width as the plan is applied, at start-up, and refuses it in one
line that names the config key of that width.

torch's tensor-parallel package is imported when a plan is made (a run with ``gang.tp_size > 1`` asks for one), not
with the zoo: ``predict`` and ``eval`` of an unsplit model never pay its import.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from torch import nn

from recipes import ConfigError

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle


def linear_pairs(layers: nn.Module, prefix: str, widths: str, keep_last: bool) -> dict[str, ParallelStyle]:
    """Consecutive pairs of the linear layers among ``layers``' children, column-wise then row-wise, ``prefix``
    being its name in the model and ``widths`` the config key of their output widths (the j-th linear layer's
    width is ``{widths}[j]``, as for ``model.hidden_dims``).

    ``keep_last``: the last linear layer stays whole, as ``recipes.megatron_mlp_plan`` keeps a model's output
    layer (a logit a task: nothing to split); otherwise it may close a pair (a tower whose output is a vector, an
    expert's last hidden layer). A layer left without a partner stays whole either way.
    """
    from torch.distributed.tensor.parallel import RowwiseParallel

    linears = [f"{prefix}.{i}" for i, layer in enumerate(layers.children()) if isinstance(layer, nn.Linear)]
    if keep_last:
        linears = linears[:-1]
    plan: dict[str, ParallelStyle] = {}
    for j, (column, row) in enumerate(zip(linears[0::2], linears[1::2])):
        plan[column] = split_outputs(f"{widths}[{2 * j}]")
        plan[row] = RowwiseParallel()
    return plan


def split_outputs(width: str) -> ParallelStyle:
    """torch's ``ColwiseParallel`` for a linear layer whose output width is the config key ``width``: a
    ``ConfigError`` when the plan is applied if the TP gang does not divide that width."""
    style: ParallelStyle = _split_outputs_style()(width)
    return style


@functools.cache
def _split_outputs_style() -> type[Any]:
    """The style's class, defined on first use, when torch's tensor-parallel package is first imported."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ColwiseParallel

    class SplitOutputs(ColwiseParallel):
        def __init__(self, width: str) -> None:
            super().__init__()
            self.width = width

        def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
            assert isinstance(module, nn.Linear), f"A split of outputs needs a linear layer, not {module}."
            if module.out_features % device_mesh.size():
                raise ConfigError(
                    f"`{self.width}` must be divisible by gang.tp_size ({device_mesh.size()}), but is "
                    f"{module.out_features} instead."
                )
            return super()._apply(module, device_mesh)

    return SplitOutputs
