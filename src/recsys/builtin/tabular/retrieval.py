"""The ``tabular`` recipe's parts for a retrieval model (``two_tower``, ``sasrec``): the item corpus counted from
the files, in-batch softmax for training, the corpus ranking for validation (``recsys.retrieval``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from recipes import ConfigError, DataReader, RecipeContext, RecipeParts
from recsys.click.batch import CTRBatch
from recsys.retrieval.units import ItemCorpus, retrieval_parts
from recsys.tabular.cardinality import count_feature_ids
from recsys.tabular.formats.data_format import DataFormat
from recsys.tabular.schema import resolve_path
from recsys.tabular.vocabulary import Encodings


def is_retrieval(model_config: Any) -> bool:
    """Whether the model is a retrieval model, validated by ranking a corpus."""
    return bool(getattr(type(model_config), "retrieval", False))


def check_retrieval_config(context: RecipeContext[Any]) -> None:
    """What a retrieval run cannot take, refused before any reading: several labels, and metrics by group or
    slice (its metrics rank the corpus, row by row)."""
    config = context.config
    if config.dataset.labels:
        raise ConfigError(
            f"The retrieval model '{config.model.name}' learns one label (the rows it retrieves), so `dataset.labels` "
            "must not be set, but is."
        )
    for key in ("group_by", "slice_by"):
        if getattr(config.metrics, key) is not None:
            raise ConfigError(
                f"The retrieval model '{config.model.name}' is validated by ranking the corpus, so `metrics.{key}` "
                f"must be null, but is '{getattr(config.metrics, key)}'."
            )


def tabular_retrieval_parts(
    context: RecipeContext[Any],
    model: torch.nn.Module,
    files: DataFormat,
    encodings: Encodings | None,
    options: dict[str, Any],
    readers: tuple[DataReader[CTRBatch], DataReader[CTRBatch], Mapping[str, DataReader[CTRBatch]]],
) -> RecipeParts:
    """The parts of a retrieval run over ``readers`` (train, valid, the further splits): the corpus is every id of
    ``model.item_feature`` in every configured file, each with its share of the training rows."""
    config, data = context.config, context.config.dataset
    feature = config.model.item_feature
    counting = {**options, "batch_size": 65_536, "shuffle": False, "drop_last": False}
    paths = list(
        dict.fromkeys(resolve_path(path) for path in (data.train_path, data.valid_path, data.test_path) if path)
    )
    ids, _ = count_feature_ids(files.reader(paths, split="all", encodings=encodings, **counting), feature)
    train = files.reader(resolve_path(data.train_path), split="train", encodings=encodings, **counting)
    train_ids, train_counts = count_feature_ids(train, feature)
    shares = np.zeros(len(ids), np.float64)
    shares[np.searchsorted(ids, train_ids)] = train_counts / max(int(train_counts.sum()), 1)
    corpus = ItemCorpus(torch.from_numpy(ids).to(context.device), torch.from_numpy(shares).to(context.device))
    train_reader, valid_reader, splits = readers
    return retrieval_parts(context, model, train_reader, valid_reader, corpus, config.model.top_k, splits)
