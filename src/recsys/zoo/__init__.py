"""The model zoo: the click-prediction models every CTR toolkit has, by ``model.name``, each with its own options.

``recsys.zoo.registry`` holds ``ZOO_MODELS``; the built-in models register there as their modules
load, which this package does.
"""

from recsys.zoo import deep, linear
from recsys.zoo.registry import (
    FIRST_ORDER_PREFIX,
    ZOO_MODELS,
    DeepModelConfig,
    ModelInputs,
    ZooEmbeddingSection,
    ZooModelConfig,
    build_zoo_model,
    check_table_dims,
)

__all__ = [
    "FIRST_ORDER_PREFIX",
    "ZOO_MODELS",
    "DeepModelConfig",
    "ModelInputs",
    "ZooEmbeddingSection",
    "ZooModelConfig",
    "build_zoo_model",
    "check_table_dims",
    "deep",
    "linear",
]
