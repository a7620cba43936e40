"""The model zoo: the click-prediction models every CTR toolkit has, by ``model.name``, each with its own options.

``recsys.zoo.zoo_model`` holds ``ZOO_MODELS`` and what every model shares; each other module of this
folder registers its models there by decorator. Every module here is imported with the package, so a
new built-in model is a new module and nothing else; another package offers its own through the
entry-point group ``recipes.zoo_models``.
"""

from components import import_submodules
from recsys.zoo.zoo_model import (
    FIRST_ORDER_PREFIX,
    ZOO_MODELS,
    DeepModelConfig,
    ModelInputs,
    ZooEmbeddingSection,
    ZooModelConfig,
    build_zoo_model,
    check_num_tasks,
    check_table_dims,
)

import_submodules(__name__, __path__)

__all__ = [
    "FIRST_ORDER_PREFIX",
    "ZOO_MODELS",
    "DeepModelConfig",
    "ModelInputs",
    "ZooEmbeddingSection",
    "ZooModelConfig",
    "build_zoo_model",
    "check_num_tasks",
    "check_table_dims",
]
