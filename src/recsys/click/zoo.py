"""The standard click-through-rate models, chosen by ``model.name``, all on the project's embedding tables.

A user comparing models on their data wants the baselines every CTR toolkit has, under one config
key, on the same tables and data path: a new model is then a one-word change, not a recipe.

Every model maps a ``CTRBatch`` to one logit per sample, ``[B]``, with either backend of
``recsys.models.embeddings``; the framework finds and steps the sparse tables at any depth. A
feature is one field: a multi-hot feature's ids are pooled by its table (sum or mean) into one
vector before any interaction, so its own ids never interact with each other, only with other
fields (the field-level FM of DeepFM and DCN-v2, not Rendle's per-id one).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Literal, get_args

import torch
from torch import nn

from gang import Gang
from recipes import PositiveInt, Range
from recsys.click.batch import CTRBatch
from recsys.click.models import DLRM, CTRModel, mlp_with_dropout
from recsys.models.embeddings import EmbeddingSection, TableSpec, build_embeddings

ZooModelName = Literal["logistic_regression", "fm", "deepfm", "dcn_v2", "dlrm", "mlp", "wide_deep"]
ZOO_MODEL_NAMES: tuple[str, ...] = get_args(ZooModelName)

FIRST_ORDER_PREFIX = "first_order_"
"""Names the dim-1 tables of first-order weights apart from the feature vectors' tables of the same features."""


@dataclass
class ZooModelSection:
    """The ``model`` section of a click-prediction recipe whose model is chosen by name.

    The defaults aim at one epoch over a small file: dropout in every deep MLP, layers no wider than
    such data supports, and the tables' own optimizer settings (see ``embeddings``).
    """

    name: ZooModelName = "dcn_v2"
    """Which model; DCN-v2 by default, among the strongest on public CTR benchmarks (BARS, SIGIR 2022)."""
    embeddings: EmbeddingSection = field(default_factory=EmbeddingSection)
    """The features' tables, and, for ``logistic_regression``, ``fm``, ``deepfm`` and ``wide_deep``, their dim-1
    first-order weights (named ``first_order_<table>``, zero at first, on the same backend and optimizer). Table L2
    (``sparse_optimizer.weight_decay``) is off: it acts only on the rows a step touches, so within one epoch
    it barely reaches the rare ids that overfit (on MovieLens, 1e-4 moved valid AUC < 0.001, 1e-3 cost 0.008).
    With ``backend: dense`` the tables are dense parameters, which the ``optimizer`` section decays."""
    hidden_dims: list[PositiveInt] = field(default_factory=lambda: [256, 128])
    """The deep MLP's hidden layers: all of ``mlp``, the deep part of ``deepfm``, ``dcn_v2`` and ``wide_deep``, DLRM's
    top MLP."""
    dropout: Annotated[float, Range(ge=0, lt=1)] = 0.2
    """Dropout after every hidden layer of the deep MLP, in [0, 1): the usual guard of deep CTR models against
    memorising rare ids (neutral on MovieLens, which one epoch does not overfit)."""
    cross_layers: PositiveInt = 3
    """DCN-v2's cross layers, each one more order of feature interaction; the paper's best are 2 to 4."""
    cross_rank: PositiveInt | None = None
    """DCN-v2's cross weight rank: ``None`` full (``D x D`` for ``D`` inputs), or ``r`` for ``U V^T`` with
    ``2 D r`` weights, which the paper finds as good at ``r`` about ``D / 4`` for wide inputs."""
    bottom_dims: list[PositiveInt] = field(default_factory=lambda: [64])
    """DLRM's bottom MLP over the dense features (its output has the embedding dim): a few dense
    features need one layer."""


def build_zoo_model(
    section: ZooModelSection,
    tables: Sequence[TableSpec],
    features: Sequence[str],
    num_dense: int,
    gang: Gang,
    seed: int,
) -> nn.Module:
    """The model ``section.name`` over ``features`` (in this order, each looked up by one of ``tables``) and
    ``num_dense`` dense features, on ``gang.device``; its sparse tables are sharded over ``gang``.

    The dense layers are initialised from ``seed`` alone, as the tables are, so that a model is the
    same whatever ran before it.
    """
    features = list(features)
    _check_features(tables, features)
    if num_dense < 0:
        raise ValueError(f"`num_dense` must be >= 0, but is {num_dense} instead.")
    emb, dim = section.embeddings, section.embeddings.dim

    def first_order() -> nn.Module:
        return build_embeddings(emb, tables, gang, seed, dim=1, prefix=FIRST_ORDER_PREFIX, init_scale=0.0)

    def vectors() -> nn.Module:
        return build_embeddings(emb, tables, gang, seed)

    model: nn.Module
    with torch.random.fork_rng(devices=[]):  # The dense layers are built on the CPU; CUDA's stream stays.
        torch.default_generator.manual_seed(seed)
        if section.name == "logistic_regression":
            model = LogisticRegression(first_order(), features, num_dense)
        elif section.name == "fm":
            model = FM(first_order(), vectors(), features, num_dense, dim)
        elif section.name == "deepfm":
            model = DeepFM(first_order(), vectors(), features, num_dense, dim, section.hidden_dims, section.dropout)
        elif section.name == "dcn_v2":
            cross = (section.cross_layers, section.cross_rank)
            model = DCNv2(vectors(), features, num_dense, dim, *cross, section.hidden_dims, section.dropout)
        elif section.name == "dlrm":
            with warnings.catch_warnings():
                # Without dense features the bottom MLP's first layer has no weights (and torch warns that
                # it initialises none): its output is then a learned vector that still meets every field.
                warnings.filterwarnings("ignore", "Initializing zero-element tensors", UserWarning)
                model = DLRM(
                    vectors(), features, num_dense, dim, section.bottom_dims, section.hidden_dims, section.dropout
                )
        elif section.name == "wide_deep":
            deep = CTRModel(vectors(), features, dim, num_dense, section.hidden_dims, section.dropout)
            model = WideDeep(LogisticRegression(first_order(), features, num_dense), deep)
        else:
            model = CTRModel(vectors(), features, dim, num_dense, section.hidden_dims, section.dropout)
    return model.to(gang.device)


def _check_features(tables: Sequence[TableSpec], features: list[str]) -> None:
    """A feature no table looks up would fail at the first batch; one no model input uses would train nothing."""
    looked_up = [feature for table in tables for feature in table.features]
    if not features:
        raise ValueError("`features` must name at least one feature, but is empty instead.")
    if len(set(features)) != len(features):
        raise ValueError(f"`features` must name each feature once, but is {features} instead.")
    if set(features) != set(looked_up):
        raise ValueError(
            f"`features` must be the features the tables look up ({', '.join(sorted(looked_up))}), "
            f"but is {', '.join(features)} instead."
        )


def _stack(pooled: Mapping[str, torch.Tensor], features: list[str]) -> torch.Tensor:
    """The features' pooled vectors as ``[B, F, dim]``."""
    return torch.stack([pooled[name] for name in features], dim=1)


class DenseLinear(nn.Module):
    """``x w + b`` over the dense features, from zero: the linear model's optimum does not depend on where it
    starts, and zero lets a model without dense features (``[B, 0]``) keep just its bias."""

    def __init__(self, num_dense: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num_dense))
        self.bias = nn.Parameter(torch.zeros(()))

    def forward(self, dense: torch.Tensor) -> torch.Tensor:
        return dense @ self.weight + self.bias


def fm_interaction(vectors: torch.Tensor) -> torch.Tensor:
    """``sum_{i<j} <v_i, v_j>`` of ``[B, n, d]`` vectors, ``[B]``, in ``O(n d)`` rather than ``O(n^2 d)``:
    half of the square of the sum less the sum of the squares (Rendle, Factorization Machines, ICDM 2010)."""
    summed = vectors.sum(dim=1)
    return 0.5 * (summed.square() - vectors.square().sum(dim=1)).sum(dim=1)


class LogisticRegression(nn.Module):
    """A weight per id and per dense feature, and a bias: the baseline every CTR model must beat.

    The weights are dim-1 tables that start at zero, so a hashed id space of any size costs one
    float per row and an id never seen in training scores as absent.
    """

    def __init__(self, first_order: nn.Module, features: list[str], num_dense: int) -> None:
        super().__init__()
        self.first_order = first_order
        self.features = features
        self.dense = DenseLinear(num_dense)

    def forward(self, batch: CTRBatch) -> torch.Tensor:
        """The click logit of every sample, ``[B]``."""
        weights = _stack(self.first_order(batch.sparse), self.features)
        logits: torch.Tensor = self.dense(batch.dense) + weights.sum(dim=(1, 2))
        return logits


class FM(nn.Module):
    """Logistic regression plus every pairwise interaction of the fields' vectors (Rendle, ICDM 2010).

    Dense features enter as Rendle's real-valued inputs do: dense feature ``j`` has a weight ``w_j``
    (the linear term) and a vector ``v_j``, and takes part in the pairwise term as ``x_j v_j``, so that
    it interacts with every categorical field (a count with a user, say), not only adds to the logit.
    """

    def __init__(
        self, first_order: nn.Module, embeddings: nn.Module, features: list[str], num_dense: int, dim: int
    ) -> None:
        super().__init__()
        self.first_order = first_order
        self.embeddings = embeddings
        self.features = features
        self.dense = DenseLinear(num_dense)
        # Small, as the tables start: interactions begin near zero and the linear terms lead early on.
        self.dense_vectors = nn.Parameter(torch.randn(num_dense, dim) * 0.01)

    def fm_logits(self, batch: CTRBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The FM's logit ``[B]`` and the fields' vectors ``[B, F, dim]`` (for DeepFM's deep part to share)."""
        weights = _stack(self.first_order(batch.sparse), self.features)
        fields = _stack(self.embeddings(batch.sparse), self.features)
        dense_fields = batch.dense.unsqueeze(2) * self.dense_vectors
        interaction = fm_interaction(torch.cat([dense_fields, fields], dim=1))
        logits = self.dense(batch.dense) + weights.sum(dim=(1, 2)) + interaction
        return logits, fields

    def forward(self, batch: CTRBatch) -> torch.Tensor:
        """The click logit of every sample, ``[B]``."""
        return self.fm_logits(batch)[0]


class DeepFM(FM):
    """An FM and an MLP over the same field vectors, their logits summed (Guo et al., DeepFM, IJCAI 2017).

    The FM catches the second-order interactions that an MLP learns poorly from products, the MLP
    the higher-order ones; sharing the vectors means no separate pre-training, unlike FNN.
    """

    def __init__(
        self,
        first_order: nn.Module,
        embeddings: nn.Module,
        features: list[str],
        num_dense: int,
        dim: int,
        hidden_dims: list[int],
        dropout: float,
    ) -> None:
        super().__init__(first_order, embeddings, features, num_dense, dim)
        self.mlp = mlp_with_dropout(num_dense + dim * len(features), hidden_dims, 1, dropout)

    def forward(self, batch: CTRBatch) -> torch.Tensor:
        """The click logit of every sample, ``[B]``."""
        fm, fields = self.fm_logits(batch)
        deep: torch.Tensor = self.mlp(torch.cat([batch.dense, fields.flatten(1)], dim=1)).squeeze(1)
        return fm + deep


class CrossLayer(nn.Module):
    """``x0 * (W x + b) + x``: one more order of explicit feature crossing per layer, with the residual
    keeping the lower orders (Wang et al., DCN V2, WWW 2021). ``rank`` factors ``W`` as ``U V^T``."""

    def __init__(self, dim: int, rank: int | None = None) -> None:
        super().__init__()
        self.down = None if rank is None else nn.Linear(dim, rank, bias=False)
        self.up = nn.Linear(dim if rank is None else rank, dim)
        # The paper's initialisation: crosses scaled to their fan, b = 0.
        for layer in (self.down, self.up):
            if layer is not None:
                nn.init.xavier_normal_(layer.weight)
        nn.init.zeros_(self.up.bias)

    def forward(self, x0: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        projected = self.up(x if self.down is None else self.down(x))
        crossed: torch.Tensor = x0 * projected + x
        return crossed


class DCNv2(nn.Module):
    """Cross layers over ``x0 = [dense, field vectors]``, then a deep MLP and a linear head, stacked
    (Wang et al., DCN V2: Improved Deep & Cross Network, WWW 2021).

    The cross network learns bounded-degree interactions explicitly, which an MLP approximates only
    with many parameters; the stacked form feeds them to the MLP for the higher orders.
    """

    def __init__(
        self,
        embeddings: nn.Module,
        features: list[str],
        num_dense: int,
        dim: int,
        cross_layers: int,
        cross_rank: int | None,
        hidden_dims: list[int],
        dropout: float,
    ) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.features = features
        in_dim = num_dense + dim * len(features)
        self.cross = nn.ModuleList([CrossLayer(in_dim, cross_rank) for _ in range(cross_layers)])
        self.mlp = mlp_with_dropout(in_dim, hidden_dims, 1, dropout)

    def forward(self, batch: CTRBatch) -> torch.Tensor:
        """The click logit of every sample, ``[B]``."""
        fields = _stack(self.embeddings(batch.sparse), self.features)
        x0 = torch.cat([batch.dense, fields.flatten(1)], dim=1)
        x = x0
        for layer in self.cross:
            x = layer(x0, x)
        logits: torch.Tensor = self.mlp(x).squeeze(1)
        return logits


class WideDeep(nn.Module):
    """Wide & Deep (Cheng et al., DLRS 2016): logistic regression's weights (the wide part, which memorises ids
    and dense features' linear effects) and ``mlp``'s tower over the fields' vectors (the deep part, which
    generalises), trained jointly, their logits summed."""

    def __init__(self, wide: LogisticRegression, deep: CTRModel) -> None:
        super().__init__()
        self.wide = wide
        self.deep = deep

    def forward(self, batch: CTRBatch) -> torch.Tensor:
        """The click logit of every sample, ``[B]``."""
        logits: torch.Tensor = self.wide(batch) + self.deep(batch)
        return logits
