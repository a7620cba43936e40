"""The dense optimizers the ``optimizer`` section chooses by name; a package may add its own.

Each built-in optimizer is a module of this folder that registers it in ``OPTIMIZERS`` by decorator
(see :mod:`recipes.optimizers.dense_optimizer`). Every module here is imported with the package, so a
new built-in optimizer is a new module and nothing else; another package offers its own through the
entry-point group ``recipes.optimizers``. The sparse tables have their own optimizers
(``model.embeddings.sparse_optimizer``).
"""

from components import import_submodules
from recipes.optimizers.dense_optimizer import OPTIMIZERS, OptimizerConfig, OptimizerFactory, build_optimizer

import_submodules(__name__, __path__)

__all__ = ["OPTIMIZERS", "OptimizerConfig", "OptimizerFactory", "build_optimizer"]
