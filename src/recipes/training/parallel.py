"""Dense parallelism with torch's own tools: DDP, FSDP2 and tensor parallelism over the job's gangs.

A model says how it splits over the TP gang (it knows its layers) through its
``tensor_parallel_plan()``; the framework applies the plan, then replicates the model over the
DP gang. State dicts go through ``torch.distributed.checkpoint``'s
helpers, which gather sharded parameters into full tensors on save and scatter them on load,
so a checkpoint is independent of the layout that wrote it.

torch's distributed tensor, FSDP and checkpoint packages are imported where they are used: together they take
0.8 s to import, which a process that trains pays anyway (``torch._dynamo``, which every torch optimizer imports,
shares most of it) but ``predict``, ``eval`` and ``importance``, which build no optimizer and (unless the run is
tensor-parallel) shard nothing, need not.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard, runtime_checkable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.nn.utils import get_total_norm
from torch.optim import Optimizer

from embedding import CombinedOptimizer
from gang import Gangs
from recipes.errors import ConfigError
from recipes.training.step_sums import StepSums

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import ParallelStyle

log = logging.getLogger(__name__)


@runtime_checkable
class TensorParallelModel(Protocol):
    """A model that can split over the TP gang: ``{submodule name: ParallelStyle}`` for
    ``torch.distributed.tensor.parallel.parallelize_module`` (``megatron_mlp_plan`` makes one for an MLP)."""

    def tensor_parallel_plan(self) -> dict[str, ParallelStyle]: ...


def megatron_mlp_plan(mlp: nn.Sequential, prefix: str) -> dict[str, ParallelStyle]:
    """How an MLP's hidden layers split over the TP gang, Megatron-style, ``prefix`` being its name in the model.

    Consecutive pairs of linear layers become column-wise then row-wise parallel, so that each
    pair needs one all-reduce. The output layer stays whole.
    """
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    linears = [f"{prefix}.{i}" for i, layer in enumerate(mlp) if isinstance(layer, nn.Linear)][:-1]
    plan: dict[str, ParallelStyle] = {}
    for column, row in zip(linears[0::2], linears[1::2]):
        plan[column] = ColwiseParallel()
        plan[row] = RowwiseParallel()
    return plan


def tensor_parallel(model: nn.Module, gangs: Gangs) -> None:
    """Split ``model`` over the TP gang by its own plan, in place; nothing without tensor parallelism.

    A model without a plan would run whole on every TP rank, each computing what the others do:
    the run stops instead, saying so.
    """
    if gangs.tp.size == 1:
        return
    if not isinstance(model, TensorParallelModel):
        raise ConfigError(
            f"`gang.tp_size` is {gangs.tp.size}, but the model ({type(model).__name__}) has no "
            "`tensor_parallel_plan()` saying how it splits over the ranks; set gang.tp_size=1 or give it one."
        )
    plan = model.tensor_parallel_plan()
    if not plan:
        log.warning("The model's tensor-parallel plan is empty: every TP rank computes the whole dense model.")
        return
    from torch.distributed.tensor.parallel import parallelize_module

    assert gangs.mesh is not None
    parallelize_module(model, gangs.mesh["tp"], plan)


def data_parallel(model: nn.Module, gangs: Gangs) -> nn.Module:
    """Replicate ``model`` over the DP gang: DDP, or FSDP2 when the model is also tensor-parallel.

    FSDP2 is torch's way of combining data and tensor parallelism (DDP does not take the
    DTensor parameters that tensor parallelism makes).
    """
    if gangs.tp.size > 1:
        from torch.distributed.fsdp import fully_shard

        assert gangs.mesh is not None
        fully_shard(model, mesh=gangs.mesh["dp"])
        return model
    if gangs.dp.size > 1:
        return StepSumsDDP(model, process_group=gangs.dp.as_process_group())
    return model


class StepSumsDDP(DistributedDataParallel):
    """DDP whose gradient all-reduce also sums the Trainer's per-step values (``step_sums``)."""

    def __init__(self, module: nn.Module, process_group: dist.ProcessGroup) -> None:
        super().__init__(module, process_group=process_group)
        self.step_sums = StepSums(process_group)
        self.register_comm_hook(None, lambda _, bucket: self.step_sums.hook(bucket))


def step_sums(model: nn.Module) -> StepSums | None:
    """The channel that sums a step's values with ``model``'s gradient sync, where it has one (DDP)."""
    return model.step_sums if isinstance(model, StepSumsDDP) else None


def gradient_sync(model: nn.Module, enabled: bool) -> contextlib.AbstractContextManager[Any]:
    """Skip the DP gradient reduction on all but the last micro-batch of a step."""
    if isinstance(model, DistributedDataParallel) and not enabled:
        return model.no_sync()
    fsdp = sys.modules.get("torch.distributed.fsdp")  # Not imported: no module can be sharded by it.
    if fsdp is not None and isinstance(model, fsdp.FSDPModule):
        model.set_requires_gradient_sync(enabled)
    return contextlib.nullcontext()


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside a DDP wrapper (FSDP2 and TP modify the module in place)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def model_state(model: nn.Module) -> dict[str, Any]:
    """The model's full state on CPU, the same on every rank (a collective under FSDP2 or TP)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(unwrap(model), options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_model_state(model: nn.Module, state: Mapping[str, Any]) -> None:
    """Load a full state dict into the model, scattering it over the ranks where its parameters are sharded.

    A model of plain tensors loads it as ``nn.Module.load_state_dict`` does (strict, as torch's helper is): the
    helper would first import ``torch._dynamo`` to look for compiled submodules: half a second of start-up that a
    ``predict`` or ``eval`` process, which builds no optimizer, otherwise never pays.
    """
    module = unwrap(model)
    try:
        if any(_is_dtensor(tensor) for tensor in (*module.parameters(), *module.buffers())):  # FSDP2 or TP
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

            set_model_state_dict(module, dict(state), options=StateDictOptions(full_state_dict=True))
        else:
            module.load_state_dict(state)
    except RuntimeError as error:  # The config builds another model than the one saved (torch's many lines).
        if "Error(s) in loading state_dict" not in str(error):
            raise
        first = next((line.strip() for line in str(error).splitlines()[1:] if line.strip()), "")
        raise ConfigError(f"The checkpoint's model must be the one the config builds, but it is not: {first}") from None


def _is_dtensor(value: object) -> TypeGuard[DTensor]:
    """Whether ``value`` is a DTensor, without importing their package: until it is imported there are none."""
    package = sys.modules.get("torch.distributed.tensor")
    return package is not None and isinstance(value, package.DTensor)


def optimizer_state(model: nn.Module, optimizer: Optimizer) -> dict[str, Any]:
    """The optimizer's full state keyed by parameter names, so that any layout can load it.

    A sparse optimizer's per-row state lives with its table shards (sharded state); only its
    step count and learning rates are here.
    """
    if isinstance(optimizer, CombinedOptimizer):
        return {"dense": optimizer_state(model, optimizer.dense), "sparse": optimizer.sparse.state_dict()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(unwrap(model), optimizer, options=options)


def load_optimizer_state(model: nn.Module, optimizer: Optimizer, state: Mapping[str, Any]) -> None:
    if isinstance(optimizer, CombinedOptimizer):
        load_optimizer_state(model, optimizer.dense, state["dense"])
        optimizer.sparse.load_state_dict(dict(state["sparse"]))
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(unwrap(model), optimizer, dict(state), options=StateDictOptions(full_state_dict=True))


def tensors_changed_by_step(optimizer: Optimizer) -> list[torch.Tensor]:
    """The parameters and optimizer state that ``optimizer.step()`` changes, local shards of DTensors.

    During training nothing else changes them, so an asynchronous checkpoint may copy them in
    the background until the next step (see ``CheckpointManager.save``).
    """
    if isinstance(optimizer, CombinedOptimizer):
        return [*tensors_changed_by_step(optimizer.dense), *optimizer.sparse.state_tensors()]
    parameters = [parameter for group in optimizer.param_groups for parameter in group["params"]]
    states = [
        value for state in optimizer.state.values() for value in state.values() if isinstance(value, torch.Tensor)
    ]
    return [tensor.to_local() if _is_dtensor(tensor) else tensor for tensor in (*parameters, *states)]


class DenseGradients:
    """The gradients of an optimizer's parameters, scaled and clipped with one foreach call per
    device mesh.

    ``clip_grad_norm_`` needs every DTensor on one device mesh, but tensor and data parallelism
    together leave parameters on two (the 2-D mesh and its dp dimension), so each mesh's norm is
    taken on its own and the results combined. The parameters are grouped once, and plain ones
    (no mesh) take one ``_foreach_norm``: ``get_total_norm``'s sorting by device and dtype cost
    twice the norm itself on a small model, and the Trainer takes the norm at every step.
    """

    def __init__(self, param_groups: Sequence[Mapping[str, Any]]) -> None:
        self._params_by_mesh: dict[Any, list[torch.Tensor]] = {}
        for group in param_groups:
            for param in group["params"]:
                mesh = param.device_mesh if _is_dtensor(param) else None
                self._params_by_mesh.setdefault(mesh, []).append(param)

    def scale_and_clip_(self, factor: float, max_norm: float) -> float:
        """Multiply the gradients by ``factor`` and scale them down to a total norm of
        ``max_norm`` if they are above it, in one pass; returns their norm after the
        multiplication, before clipping (0 without gradients)."""
        grads_by_mesh = self._grads_by_mesh()
        norms = []
        for mesh, grads in grads_by_mesh.items():
            if mesh is None:
                norms.append(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads))))
            else:
                norm = get_total_norm(grads)
                norms.append(norm.full_tensor() if _is_dtensor(norm) else norm)
        if not norms:
            return 0.0
        total = float(norms[0]) if len(norms) == 1 else float(torch.linalg.vector_norm(torch.stack(norms)))
        total *= abs(factor)
        clip = max_norm / (total + 1e-6)
        _multiply(grads_by_mesh, factor * clip if clip < 1.0 else factor)
        return total

    def scale_(self, factor: float) -> None:
        _multiply(self._grads_by_mesh(), factor)

    def _grads_by_mesh(self) -> dict[Any, list[torch.Tensor]]:
        grads_by_mesh = {}
        for mesh, params in self._params_by_mesh.items():
            grads = [param.grad for param in params if param.grad is not None]
            if grads:
                grads_by_mesh[mesh] = grads
        return grads_by_mesh


def _multiply(grads_by_mesh: Mapping[Any, list[torch.Tensor]], factor: float) -> None:
    for grads in grads_by_mesh.values():
        torch._foreach_mul_(grads, factor)
