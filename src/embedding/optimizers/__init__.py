"""Sparse optimizers, chosen by name: how the fused step updates the rows a step touches.

Each built-in optimizer is one module of this folder: its config dataclass, its update as
``register_jitable`` functions, and the function of its config to its
:class:`SparseOptimizerSpec`, registered by decorator in :data:`SPARSE_OPTIMIZERS` (see
:mod:`embedding.optimizers.optimizer_config` and :mod:`embedding.optimizers.optimizer_spec`). Every module here is
imported with the package, so a new built-in optimizer is a new module and nothing else; another
package offers its own through the entry-point group ``recipes.sparse_optimizers``.
"""

from components import import_submodules
from embedding.optimizers.optimizer_config import (
    SPARSE_OPTIMIZERS,
    SparseOptimizerConfig,
    SparseOptimizerError,
    init_optimizer_state,
    sparse_optimizer_config,
    spec_of,
)
from embedding.optimizers.optimizer_spec import (
    DECOUPLED,
    L2_PENALTY,
    OptimizerState,
    SparseOptimizerSpec,
    WeightDecay,
    sqrt,
)

import_submodules(__name__, __path__)

__all__ = [
    "DECOUPLED",
    "L2_PENALTY",
    "SPARSE_OPTIMIZERS",
    "OptimizerState",
    "SparseOptimizerConfig",
    "SparseOptimizerError",
    "SparseOptimizerSpec",
    "WeightDecay",
    "init_optimizer_state",
    "sparse_optimizer_config",
    "spec_of",
    "sqrt",
]
