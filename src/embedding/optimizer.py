"""The sparse optimizer of an embedding collection, and its combination with a dense one.

Each table's shard is stepped by the fused kernel of its optimizer (the table's override or
the collection default). Every table appears as one parameter group without parameters
whose ``"lr"`` the kernel reads, so that a torch LR scheduler drives sparse and dense learning
rates alike through :class:`CombinedOptimizer`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch

from embedding.collection import ShardedEmbeddingCollection
from embedding.kernels import fused_step
from embedding.memory import check_memory, state_bytes
from embedding.optimizers import SparseOptimizerConfig, init_optimizer_state, spec_of
from embedding.row_changes import mark_changed


class SparseOptimizerStateError(ValueError):
    """Raised when a sparse optimizer state dict does not fit the optimizer."""


class SparseOptimizer:
    """Steps every table of ``collections`` with the gradients recorded since ``zero_grad``.

    One fused kernel call steps each shard group (tables sharing a buffer, a dim and an
    optimizer). A table is stepped by its own optimizer override, else by ``config``, else by
    its collection's ``optimizer``. The tables of each collection and optimizer form one
    parameter group, ``{"params": [], "lr", "tables": [names]}``, the same whatever the gang,
    so its state dict loads anywhere. The optimizer state lives on the groups and shards, so
    that the collection's sharded state dict saves and reshards it with the rows it belongs
    to; this object's own state dict holds only the step count and learning rates.
    ``backend`` picks the kernel backend (default: by device).
    """

    def __init__(
        self,
        collections: ShardedEmbeddingCollection | Sequence[ShardedEmbeddingCollection],
        config: SparseOptimizerConfig | None = None,
        backend: str | None = None,
    ) -> None:
        if isinstance(collections, ShardedEmbeddingCollection):
            collections = [collections]
        self.collections: tuple[ShardedEmbeddingCollection, ...] = tuple(collections)
        self._groups = [group for collection in self.collections for group in collection.groups]
        self._changed_rows = [mask for collection in self.collections for mask in collection.changed_rows]
        self._backend = backend
        self._step = 0
        self._grad_multiplier = 1.0
        self.param_groups: list[dict[str, Any]] = []
        self._configs: list[SparseOptimizerConfig] = []
        self._param_group_of: list[int] = []
        for collection in self.collections:
            default = config if config is not None else collection.optimizer
            overrides = list(dict.fromkeys(table.optimizer for table in collection.tables))
            first = len(self.param_groups)
            self.param_groups += [
                {
                    "params": [],
                    "lr": (override or default).lr,
                    "tables": [table.name for table in collection.tables if table.optimizer == override],
                }
                for override in overrides
            ]
            for group in collection.groups:
                self._configs.append(group.optimizer or default)
                self._param_group_of.append(first + overrides.index(group.optimizer))
        self.state_bytes = sum(
            state_bytes(group.weight.size(0), group.weight.size(1), group_config)
            for group, group_config in zip(self._groups, self._configs)
        )
        """This rank's bytes of optimizer state, which this optimizer allocates for its tables."""
        if self.collections:
            gang = self.collections[0].gang
            check_memory(self.state_bytes, gang.device, gang.rank, what="The sparse tables' optimizer state")
        for group, group_config in zip(self._groups, self._configs):
            weight = group.weight
            fill = {state.name: state.initial_value for state in spec_of(group_config).layout}
            group.set_optimizer_state(
                init_optimizer_state(group_config, weight.size(0), weight.size(1), torch.float32, weight.device), fill
            )

    @property
    def step_count(self) -> int:
        return self._step

    def scale_gradients(self, factor: float) -> None:
        """Multiply the gradients recorded since ``zero_grad`` by ``factor`` before the next step.

        A trainer normalises the gradient of a summed loss by the number of targets this way.
        The factor scales the per-occurrence multipliers, a vector as long as the ids, rather
        than the gradient rows.
        """
        self._grad_multiplier *= factor

    def step(self) -> None:
        self._step += 1
        multiplier, self._grad_multiplier = self._grad_multiplier, 1.0
        for group, group_config, param_group_index, changed in zip(
            self._groups, self._configs, self._param_group_of, self._changed_rows
        ):
            if group.dynamic is not None:
                group.dynamic.index.advance()  # what forward inserts from here on belongs to the next step
            grads = group.accumulated_grads()
            if grads is None:
                continue
            grad_scale = grads.grad_scale
            if multiplier != 1.0:
                grad_scale = (
                    torch.full(grads.ids.shape, multiplier, dtype=torch.float32, device=grads.ids.device)
                    if grad_scale is None
                    else grad_scale * multiplier
                )
            fused_step(
                group_config,
                group.weight,
                group.optimizer_state,
                grads.ids,
                grads.grad_rows,
                grads.grad_index,
                grad_scale,
                step=self._step,
                lr=float(self.param_groups[param_group_index]["lr"]),
                backend=self._backend,
                sorted_ids=grads.sorted_ids,
                row_keys=group.row_keys() if group.weight.dtype != torch.float32 else None,
            )
            mark_changed(changed, grads.ids)
        self._release_cached_rows()

    def _release_cached_rows(self) -> None:
        """Unpin the rows that tiered tables' training lookups pinned: updated now, or never to be."""
        for group in self._groups:
            if group.tier is not None:
                group.tier.release()

    def state_tensors(self) -> list[torch.Tensor]:
        """The tables and their optimizer state: what ``step`` changes."""
        return [tensor for group in self._groups for tensor in (group.weight, *group.optimizer_state.values())]

    def zero_grad(self) -> None:
        self._grad_multiplier = 1.0
        for group in self._groups:
            group.grads.clear()
        self._release_cached_rows()

    def state_dict(self) -> dict[str, Any]:
        groups = [{key: value for key, value in group.items() if key != "params"} for group in self.param_groups]
        return {"step": self._step, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved_tables = [group["tables"] for group in state_dict["param_groups"]]
        tables = [group["tables"] for group in self.param_groups]
        if saved_tables != tables:
            raise SparseOptimizerStateError(
                f"The state dict must hold the table groups {tables}, but holds {saved_tables} instead."
            )
        self._step = int(state_dict["step"])
        # In place: an LR scheduler holds these very dicts.
        for group, saved in zip(self.param_groups, state_dict["param_groups"]):
            group.update(saved)


class CombinedOptimizer(torch.optim.Optimizer):
    """A dense torch optimizer and a sparse one, stepped as one.

    ``param_groups`` are the dense groups followed by the sparse ones (the same dicts), so a
    torch LR scheduler, which only accepts an ``Optimizer``, scales both. The base constructor
    is not called: it would copy the groups; the attributes it sets are set here instead.
    """

    def __init__(self, dense: torch.optim.Optimizer, sparse: SparseOptimizer) -> None:
        self.dense = dense
        self.sparse = sparse
        self.defaults: dict[str, Any] = {}
        self._optimizer_step_pre_hooks = OrderedDict()
        self._optimizer_step_post_hooks = OrderedDict()
        self._optimizer_state_dict_pre_hooks = OrderedDict()
        self._optimizer_state_dict_post_hooks = OrderedDict()
        self._optimizer_load_state_dict_pre_hooks = OrderedDict()
        self._optimizer_load_state_dict_post_hooks = OrderedDict()

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        # Read on every access: loading a dense state dict replaces its group dicts.
        return [*self.dense.param_groups, *self.sparse.param_groups]

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.dense.state

    def step(self, closure: None = None) -> None:  # type: ignore[override]
        self.dense.step()
        self.sparse.step()

    def scale_sparse_gradients(self, factor: float) -> None:
        """Scale the sparse gradients, which are not in ``param_groups`` (see ``SparseOptimizer``)."""
        self.sparse.scale_gradients(factor)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.dense.zero_grad(set_to_none)
        self.sparse.zero_grad()

    def state_dict(self) -> dict[str, Any]:
        return {"dense": self.dense.state_dict(), "sparse": self.sparse.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.dense.load_state_dict(state_dict["dense"])
        self.sparse.load_state_dict(state_dict["sparse"])
