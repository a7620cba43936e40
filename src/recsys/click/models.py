"""Click-through-rate models over pooled embeddings: an MLP over concatenated features, and DLRM.

Both take ``embeddings``, a module mapping a batch's sparse features to ``[B, dim]`` per feature:
sparse sharded tables or dense embedding bags (see ``recsys.models.embeddings``). More models, by
name, are in ``recsys.zoo``.

Every model here is a ``PooledModel``: its sparse lookups (``lookups``) apart from its dense part
(``dense_logits``), so that ``python -m recipes export`` can write the dense part alone for serving
(``dense_for_serving``, the framework's ``ServableModel``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

from embedding import ShardedEmbeddingCollection
from recipes import DenseForServing, PooledInput, megatron_mlp_plan
from recsys.click.batch import CTRBatch
from recsys.click.tasks import Task
from recsys.models.embeddings import DenseEmbeddingBags
from recsys.models.mlp import mlp

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle

VECTORS, FIRST_ORDER = "vectors", "first_order"
"""The roles of a model's embedding modules: the features' vectors, and the dim-1 first-order weights."""

Pooled = Mapping[str, Mapping[str, torch.Tensor]]
"""A batch's pooled vectors ``[B, dim]`` by the role of the embedding module that pooled them, then by feature."""


class TaskModel(nn.Module):
    """A click model of one logit a task, which serves each task's score."""

    tasks: tuple[Task, ...] = ()
    """The tasks of the outputs ``[B, T]``, for serving (a regression task's output is its prediction, a binary
    one's goes through a sigmoid); set by the recipe that knows them (``click_prediction_parts``). Empty: one click
    logit ``[B]``."""

    def served_scores(self, logits: torch.Tensor) -> torch.Tensor:
        """The scores ``predict`` writes from the model's logits ``[B]`` or ``[B, T]``: a probability a binary
        task, a regression task's prediction as it is."""
        binary = [task.binary for task in self.tasks] or [True]
        logits = logits.float()
        if logits.dim() == 1:
            return torch.sigmoid(logits) if binary[0] else logits
        columns = [torch.sigmoid(logits[:, t]) if is_binary else logits[:, t] for t, is_binary in enumerate(binary)]
        return torch.stack(columns, dim=1)

    def served_outputs(self) -> tuple[str, ...]:
        """The names of the served scores' columns, with several tasks."""
        return tuple(task.name for task in self.tasks) if len(self.tasks) > 1 else ()


class ServedSequenceModel(nn.Module):
    """The served scores of a task model that takes sequences: its ``served_logits(dense, pooled, sequences,
    lengths)`` (the inputs its ``DenseForServing`` lists) through ``served_scores``. What ``torch.export`` traces."""

    def __init__(self, model: TaskModel) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        dense: torch.Tensor,
        pooled: list[torch.Tensor],
        sequences: list[torch.Tensor],
        lengths: list[torch.Tensor],
    ) -> torch.Tensor:
        logits: torch.Tensor = self.model.served_logits(dense, pooled, sequences, lengths)  # type: ignore[operator]
        return self.model.served_scores(logits)


class PooledModel(TaskModel):
    """A click model as sparse lookups (``lookups``), then a dense part over the pooled vectors and the dense
    features (``dense_logits``): the cut at which a serving system takes over the lookups.

    ``forward`` is the two in turn, so training and serving run the same dense code.
    """

    num_dense: int

    def lookups(self) -> dict[str, tuple[nn.Module, list[str]]]:
        """Each embedding module by its role, with the features the dense part takes from it, in order."""
        raise NotImplementedError

    def dense_logits(self, dense: torch.Tensor, pooled: Pooled) -> torch.Tensor:
        """The click logit of every sample, ``[B]`` (``[B, T]`` with T tasks), from the dense features
        ``[B, num_dense]`` and pooled vectors."""
        raise NotImplementedError

    def forward(self, batch: CTRBatch) -> torch.Tensor:
        """The click logit of every sample, ``[B]``."""
        pooled = {role: module(batch.sparse) for role, (module, _) in self.lookups().items()}
        return self.dense_logits(batch.dense, pooled)

    def dense_for_serving(self) -> DenseForServing:
        """The dense part, scoring (a probability, as ``predict`` writes; with several tasks ``[B, T]``, a regression
        task's prediction as it is) from the pooled vectors in a list."""
        keys = [(role, feature) for role, (_, features) in self.lookups().items() for feature in features]
        inputs = tuple(
            pooled_input(module, feature) for module, features in self.lookups().values() for feature in features
        )
        return DenseForServing(_ServingDense(self, keys), self.num_dense, inputs, self.served_outputs())


class _ServingDense(nn.Module):
    """``model.dense_logits`` over a list of pooled vectors, as a probability (a regression task's output as it is):
    what ``torch.export`` traces."""

    def __init__(self, model: PooledModel, keys: list[tuple[str, str]]) -> None:
        super().__init__()
        self.model = model
        self.keys = keys

    def forward(self, dense: torch.Tensor, pooled: list[torch.Tensor]) -> torch.Tensor:
        by_role: dict[str, dict[str, torch.Tensor]] = {}
        for (role, feature), vectors in zip(self.keys, pooled):
            by_role.setdefault(role, {})[feature] = vectors
        return self.model.served_scores(self.model.dense_logits(dense, by_role))


def pooled_input(module: nn.Module, feature: str) -> PooledInput:
    """Which table of ``module`` pools ``feature``, with its dim and pooling. A table that does not pool (a
    sequence's) is served for its one-id-a-row feature (the sequence's candidate, whose row a model reads as it is):
    the sum of that one row."""
    if isinstance(module, ShardedEmbeddingCollection):
        table = next(table for table in module.tables if feature in table.features)
        return PooledInput(table.name, feature, table.dim, "sum" if table.pooling == "none" else table.pooling)
    if isinstance(module, DenseEmbeddingBags):
        name = module.table_of[feature]
        bag = module.bags[name]
        assert isinstance(bag, (nn.Embedding, nn.EmbeddingBag))
        mean = isinstance(bag, nn.EmbeddingBag) and bag.mode == "mean"
        return PooledInput(name, feature, bag.embedding_dim, "mean" if mean else "sum")
    raise TypeError(f"An embedding module must be sparse tables or embedding bags, but is {type(module).__name__}.")


def task_logits(head: torch.Tensor) -> torch.Tensor:
    """A head's ``[B, T]`` outputs as a model's logits: ``[B]`` for one task, as every single-task caller takes
    them, ``[B, T]`` for several (one column per task, from the same last layer: a shared-bottom model)."""
    return head.squeeze(1) if head.shape[1] == 1 else head


def plus_shared(shared: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """``logits`` (``[B]`` or ``[B, T]``) plus a part ``[B]`` that every task shares (a wide or FM logit)."""
    return shared.unsqueeze(1) + logits if logits.dim() == 2 else shared + logits


def mlp_with_dropout(in_dim: int, hidden_dims: list[int], out_dim: int, dropout: float = 0.0) -> nn.Sequential:
    """``mlp`` with dropout after every hidden ReLU, the usual guard of CTR MLPs against memorising rare ids.

    With ``dropout=0`` it is ``mlp`` itself, layer for layer, so that checkpoints' parameter names stay.
    """
    if dropout == 0.0:
        return mlp(in_dim, hidden_dims, out_dim)
    layers: list[nn.Module] = []
    for hidden in hidden_dims:
        layers += [nn.Linear(in_dim, hidden), nn.ReLU(), nn.Dropout(dropout)]
        in_dim = hidden
    layers.append(nn.Linear(in_dim, out_dim))
    return nn.Sequential(*layers)


class CTRModel(PooledModel):
    """The pooled embedding of every categorical feature, concatenated with the dense features, into an MLP.

    The deep tower of Wide & Deep (Cheng et al., DLRS 2016) and of YouTube's recommender (Covington et al.,
    RecSys 2016): interactions are left for the MLP to learn from the concatenation.
    """

    def __init__(
        self,
        embeddings: nn.Module,
        feature_names: list[str],
        embedding_dim: int | Sequence[int],
        num_dense: int,
        hidden_dims: list[int],
        dropout: float = 0.0,
        num_tasks: int = 1,
    ) -> None:
        """``embedding_dim``: every feature's width, or each feature's in ``feature_names``' order; ``num_tasks``
        outputs of the last layer, one per task."""
        super().__init__()
        self.embeddings = embeddings
        self.feature_names = feature_names
        self.num_dense = num_dense
        dims = [embedding_dim] * len(feature_names) if isinstance(embedding_dim, int) else list(embedding_dim)
        if len(dims) != len(feature_names):
            raise ValueError(
                f"`embedding_dim` must give one dim per feature ({len(feature_names)}), but gives {len(dims)}."
            )
        self.mlp = mlp_with_dropout(num_dense + sum(dims), hidden_dims, num_tasks, dropout)

    def tensor_parallel_plan(self) -> dict[str, ParallelStyle]:
        return megatron_mlp_plan(self.mlp, "mlp")

    def lookups(self) -> dict[str, tuple[nn.Module, list[str]]]:
        return {VECTORS: (self.embeddings, self.feature_names)}

    def dense_logits(self, dense: torch.Tensor, pooled: Pooled) -> torch.Tensor:
        features = torch.cat([dense, *(pooled[VECTORS][name] for name in self.feature_names)], dim=1)
        return task_logits(self.mlp(features))


class DLRM(PooledModel):
    """Pairwise dot products of the fields' vectors and the dense features' bottom-MLP vector, into a top MLP
    (Naumov et al., Deep Learning Recommendation Model, 2019).

    The embedding dimension is shared by every table and the bottom MLP's output, which the dots need.

    ``dropout`` applies to the top MLP only: the bottom one sees a handful of dense features.
    """

    def __init__(
        self,
        embeddings: nn.Module,
        feature_names: list[str],
        num_dense: int,
        embedding_dim: int,
        bottom_dims: list[int],
        top_dims: list[int],
        dropout: float = 0.0,
        num_tasks: int = 1,
    ) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.feature_names = feature_names
        self.num_dense = num_dense
        self.bottom_mlp = nn.Sequential(mlp(num_dense, bottom_dims, embedding_dim), nn.ReLU())
        num_vectors = len(feature_names) + 1
        num_interactions = num_vectors * (num_vectors - 1) // 2
        self.top_mlp = mlp_with_dropout(embedding_dim + num_interactions, top_dims, num_tasks, dropout)

    def tensor_parallel_plan(self) -> dict[str, ParallelStyle]:
        return megatron_mlp_plan(self.top_mlp, "top_mlp")  # The bottom MLP sees a handful of dense features.

    def lookups(self) -> dict[str, tuple[nn.Module, list[str]]]:
        return {VECTORS: (self.embeddings, self.feature_names)}

    def dense_logits(self, dense: torch.Tensor, pooled: Pooled) -> torch.Tensor:
        dense = self.bottom_mlp(dense)
        vectors = torch.stack([dense, *(pooled[VECTORS][name] for name in self.feature_names)], dim=1)
        dots = torch.bmm(vectors, vectors.transpose(1, 2))
        # The pairs are made where the dots are: indices kept on the CPU took a blocking copy to the GPU at every
        # forward, which waited for every kernel queued before it.
        rows, cols = torch.triu_indices(vectors.size(1), vectors.size(1), offset=1, device=dots.device)
        interactions = dots[:, rows, cols]
        return task_logits(self.top_mlp(torch.cat([dense, interactions], dim=1)))
