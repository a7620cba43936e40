"""Units of a retrieval model: in-batch softmax for training, the rank of each row's item among the whole corpus
for validation (HR@K, NDCG@K), and the parts a retrieval recipe returns.

Training scores each row's query against the items of every row of the batch (in-batch negatives, no extra
lookup): a softmax whose target is the row's own item. The batch samples items by their frequency, so popular
items would be pushed down as negatives far more than the catalogue warrants; subtracting ``log q`` (q: the
item's share of the training rows) from each logit corrects this (Yi et al., RecSys 2019), and a row's item that
another row of the batch also holds is not a negative of it. Only rows of a positive label are targets (a
rating >= 4, a click); every row's item is a negative for the others.

Validation ranks each positive row's item among every item of the corpus, exactly: the queries are scored
against the corpus in chunks, in float64 (so that an item's rank does not depend on how the scores were cut into
chunks), and the rank is the number of other items scored higher. On several data-parallel ranks the corpus is
split between them: each looks up the vectors of its share of the items only, scores every rank's queries of a
batch against them, and the ranks' counts are summed, so that each rank holds ``1 / size`` of the corpus and
the ranks are those of one process. HR@K is the share of rows ranked below K (with
one held-out item a row, recall@K equals it), NDCG@K adds ``1 / log2(rank + 2)`` for those.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.functional import cross_entropy

from gang import Gang, ReduceOperation
from recipes import DataReader, RecipeContext, RecipeParts, Validation
from recsys.click.batch import CTRBatch
from recsys.retrieval.model import RetrievalModel
from units import EvalUnit, Mean, MetricBag, TrainUnit

CORPUS_CHUNK = 8192
"""Items scored at once against a batch's queries: bounds the scores' memory at ``B x 8192`` float64."""


@dataclass(frozen=True)
class ItemCorpus:
    """Every item id of the data (sorted, unique) and each one's share of the training rows' items (zero for an
    item only validation or test rows hold), on the device the model computes on."""

    ids: torch.Tensor
    train_shares: torch.Tensor

    def log_shares(self, ids: torch.Tensor) -> torch.Tensor:
        """``log q`` of each of ``ids`` (an id the corpus lacks, or of no training row, counts as once seen in the
        training rows, so that its logit is not corrected by minus infinity)."""
        at = torch.searchsorted(self.ids, ids).clamp(max=self.ids.numel() - 1)
        shares = torch.where(self.ids[at] == ids, self.train_shares[at], 0.0)
        floor = self.train_shares[self.train_shares > 0].min() if bool((self.train_shares > 0).any()) else 1.0
        return torch.log(shares.clamp(min=float(floor)))


class RankQuality(Mean):
    """A mean over rows of a ranking's quality (a hit, a discounted gain): higher is better, so that it scores
    checkpoints without ``trainer.lower_better``."""

    higher_is_better = True

    def update_rows(self, values: torch.Tensor) -> None:
        """One value a row; a batch of no row adds nothing (and still counts as an update)."""
        if values.numel() == 0:
            self.update(0.0, weight=0.0)
        else:
            self.update(values, weight=1.0)


def unwrapped(model: nn.Module) -> RetrievalModel:
    """The retrieval model inside a wrapper such as DDP."""
    inner = getattr(model, "module", model)
    if not isinstance(inner, RetrievalModel):
        raise TypeError(f"The model must be a RetrievalModel, but is {type(inner).__name__} instead.")
    return inner


class RetrievalTrainUnit(TrainUnit[CTRBatch]):
    """In-batch softmax with ``log q`` correction, one loss a row (zero for a row of a negative label)."""

    def __init__(self, model: nn.Module, metric_bag: MetricBag, device: torch.device, corpus: ItemCorpus) -> None:
        super().__init__(model, metric_bag)
        self._device = device
        self._corpus = corpus

    def __call__(self, batch: CTRBatch) -> torch.Tensor:
        batch = batch.to(self._device)
        queries, items = self.model(batch)
        ids = batch.sparse[unwrapped(self.model).item_feature].ids
        logits = queries.float() @ items.float().T / unwrapped(self.model).temperature
        logits = logits - self._corpus.log_shares(ids).to(logits.dtype).unsqueeze(0)
        same_item = ids.unsqueeze(0) == ids.unsqueeze(1)
        same_item.fill_diagonal_(False)
        logits = logits.masked_fill(same_item, float("-inf"))  # Another row's copy of my item is no negative.
        targets = torch.arange(len(ids), device=logits.device)
        positive = (batch.labels > 0.5).to(logits.dtype)
        loss: torch.Tensor = cross_entropy(logits, targets, reduction="none") * positive
        return loss


class RetrievalEvalUnit(EvalUnit[CTRBatch]):
    """HR@K and NDCG@K of each positive row's item among the whole corpus, for each K of ``top_k``."""

    def __init__(
        self,
        model: nn.Module,
        metric_bag: MetricBag,
        device: torch.device,
        corpus: ItemCorpus,
        top_k: Sequence[int],
        name: str = "valid",
    ) -> None:
        super().__init__(model, metric_bag, name)
        self._device = device
        self._corpus = corpus
        self._top_k = list(top_k)
        self._corpus_vectors: torch.Tensor | None = None
        self._vectors_at = -1
        self._hits = {k: RankQuality() for k in self._top_k}
        self._gains = {k: RankQuality() for k in self._top_k}
        for k in self._top_k:
            metric_bag.register(f"hr@{k}", self._hits[k])
            metric_bag.register(f"ndcg@{k}", self._gains[k])

    def __call__(self, batch: CTRBatch) -> None:
        self.predict(batch)

    def predict(self, batch: CTRBatch) -> dict[str, torch.Tensor]:
        """Update the metrics; each row's label, the logit of its item and that item's rank in the corpus."""
        batch = batch.to(self._device)
        model = unwrapped(self.model)
        queries, items = self.model(batch)
        ids = batch.sparse[model.item_feature].ids
        ranks = self._ranks(queries, items, ids)
        positive = batch.labels > 0.5
        for k in self._top_k:
            hit = (ranks < k) & positive
            gain = torch.where(hit, 1.0 / torch.log2(ranks.to(torch.float64) + 2.0), 0.0)
            self._hits[k].update_rows(hit[positive].to(torch.float64))
            self._gains[k].update_rows(gain[positive])
        score = (queries.float() * items.float()).sum(-1) / model.temperature
        return {"label": batch.labels, "score": score, "rank": ranks}

    def _ranks(self, queries: torch.Tensor, items: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """How many corpus items other than each row's own score higher for its query: every rank's rows counted
        against this rank's share of the corpus, the counts summed over the ranks."""
        gang = self.metric_bag.gang
        queries = queries.to(torch.float64)
        own = (queries * items.to(torch.float64)).sum(-1)
        rows = torch.tensor([len(ids)], device=queries.device)
        sizes = torch.empty(gang.size, 1, dtype=rows.dtype, device=rows.device)
        gang.all_gather(sizes, rows)
        widest = int(sizes.max())
        gathered = [_gathered(gang, _padded(tensor, widest)) for tensor in (queries, own, ids)]
        counts = self._count_higher(*gathered)
        gang.all_reduce(counts, ReduceOperation.SUM)
        return counts.reshape(gang.size, widest)[gang.rank, : len(ids)]

    def _count_higher(self, queries: torch.Tensor, own: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Per query, the items of this rank's share of the corpus, other than its own, that score higher."""
        vectors, share = self._vectors()
        counts = torch.zeros(len(ids), dtype=torch.int64, device=queries.device)
        for start in range(0, len(share), CORPUS_CHUNK):
            higher = (queries @ vectors[start : start + CORPUS_CHUNK].T) > own.unsqueeze(1)
            counts += (higher & (share[start : start + CORPUS_CHUNK].unsqueeze(0) != ids.unsqueeze(1))).sum(1)
        return counts

    def _vectors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's share of the corpus (every ``size``-th item from its rank) and the items' vectors, looked up
        at the first batch after the model was last switched to ``eval`` (each validation's first): every rank
        looks up its share in the same batch, as sharded tables need."""
        model, gang = unwrapped(self.model), self.metric_bag.gang
        share = self._corpus.ids[gang.rank :: gang.size]
        if self._corpus_vectors is None or model.mode_changes != self._vectors_at:
            parts = [model.items(share[start : start + CORPUS_CHUNK]) for start in range(0, len(share), CORPUS_CHUNK)]
            self._corpus_vectors = torch.cat(parts).to(torch.float64) if parts else torch.zeros(0, 0)
            self._vectors_at = model.mode_changes
        return self._corpus_vectors, share


def _padded(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """``tensor`` with zero rows appended up to ``rows``, so that every rank gathers the same shape."""
    return torch.cat([tensor, tensor.new_zeros(rows - len(tensor), *tensor.shape[1:])])


def _gathered(gang: Gang, tensor: torch.Tensor) -> torch.Tensor:
    """Every rank's ``tensor``, one after the other."""
    if gang.size == 1:
        return tensor
    output = tensor.new_empty(gang.size, *tensor.shape)
    gang.all_gather(output, tensor)
    return output.reshape(gang.size * tensor.shape[0], *tensor.shape[1:])


def retrieval_parts(
    context: RecipeContext[Any],
    model: nn.Module,
    train_reader: DataReader[CTRBatch],
    valid_reader: DataReader[CTRBatch],
    corpus: ItemCorpus,
    top_k: Sequence[int],
    splits: Mapping[str, DataReader[CTRBatch]] | None = None,
) -> RecipeParts:
    """The parts of a retrieval recipe: in-batch softmax for training, the corpus ranking for validation and the
    further ``splits`` that ``eval`` and ``predict`` may score."""
    dp, device = context.gangs.dp, context.device
    return RecipeParts(
        train_unit=RetrievalTrainUnit(model, MetricBag(dp), device, corpus),
        train_reader=train_reader,
        validations=[Validation(RetrievalEvalUnit(model, MetricBag(dp), device, corpus, top_k), valid_reader)],
        splits=dict(splits or {}),
    )
