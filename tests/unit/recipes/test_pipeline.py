"""The train pipeline's reader: the plain reader's steps and positions, read a step ahead on its own
thread, with the sparse ids prepared ahead for the model's collections (GitHub issue 17). The pipelined
loop against the plain one in real runs: tests/integration/recipes/test_pipeline.py."""

from __future__ import annotations

import logging
import threading
from collections import namedtuple
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from embedding import EmbeddingTableConfig, JaggedIds, ShardedEmbeddingCollection, SparseFeatureError, SparseFeatures
from gang import FakeGang, Gangs
from recipes.runtime import threads
from recipes.training.data_reader import DataError, DataReader
from recipes.training.pipeline import PipelinedReader, _map_tensors, use_pipeline
from recsys.data.memory import InMemoryReader

CPU = torch.device("cpu")
GANGS = Gangs(root=FakeGang(CPU), dp=FakeGang(CPU), tp=FakeGang(CPU))
TABLES = [EmbeddingTableConfig("t", 50, 4, ("a", "b"))]


@dataclass(frozen=True)
class Batch:
    dense: torch.Tensor
    sparse: SparseFeatures


class Recorded:
    """Batches of a sample's index as dense value and ids, noting the thread each was made on."""

    def __init__(self, draw_from_global_generator: bool = False, fail_at_read: int | None = None) -> None:
        self.threads: list[str] = []
        self._draw = draw_from_global_generator
        self._fail_at_read = fail_at_read

    def __call__(self, indices: torch.Tensor) -> Batch:
        self.threads.append(threading.current_thread().name)
        if len(self.threads) == self._fail_at_read:
            raise DataError(f"data.csv:{len(self.threads)}: a bad row")
        if self._draw:
            torch.rand(1)
        ids = JaggedIds.from_dense(indices.view(-1, 1) % 50)
        return Batch(indices.float(), SparseFeatures({"a": ids, "b": ids}))


def reader(make_batch: Recorded, num_samples: int = 20, num_accumulate: int = 1) -> InMemoryReader[Batch]:
    return InMemoryReader(make_batch, num_samples, batch_size=3, num_accumulate=num_accumulate, seed=5)


def take(data: DataReader[Batch], num_steps: int) -> list[list[list[float]]]:
    """The dense tensors of ``num_steps`` steps, starting the next epoch where one ends."""
    steps = []
    for _ in range(num_steps):
        try:
            batches = next(data)
        except StopIteration:
            data.reset()
            batches = next(data)
        steps.append([batch.dense.tolist() for batch in batches])
    return steps


def test_steps_positions_and_epochs_are_the_plain_readers() -> None:
    plain, made = reader(Recorded()), Recorded()
    piped = PipelinedReader(reader(made), [], CPU, GANGS)
    for _ in range(15):  # 6 steps an epoch: over two epoch ends
        assert take(piped, 1) == take(plain, 1)
        assert piped.state_dict() == plain.state_dict()
    piped.close()
    assert set(made.threads) == {"train-pipeline"}


def test_a_resume_reads_the_step_read_ahead_again() -> None:
    piped = PipelinedReader(reader(Recorded(), num_accumulate=2), [], CPU, GANGS)
    take(piped, 2)
    state = piped.state_dict()  # the step read ahead is not in it
    expected = take(piped, 3)
    piped.close()

    resumed = PipelinedReader(reader(Recorded(), num_accumulate=2), [], CPU, GANGS)
    resumed.load_state_dict(state)
    assert take(resumed, 3) == expected
    resumed.close()


def test_a_read_error_is_raised_at_the_step_that_reads_it() -> None:
    piped = PipelinedReader(reader(Recorded(fail_at_read=3)), [], CPU, GANGS)
    take(piped, 2)  # the third read fails while the second step computes
    with pytest.raises(DataError, match=r"data\.csv:3"):
        next(piped)
    piped.close(wait=False)


def test_a_reader_that_draws_from_the_global_generator_is_read_on_the_main_thread(
    caplog: pytest.LogCaptureFixture,
) -> None:
    made = Recorded(draw_from_global_generator=True)
    plain = reader(Recorded())
    piped = PipelinedReader(reader(made), [], CPU, GANGS)
    with caplog.at_level(logging.WARNING):
        assert take(piped, 4) == take(plain, 4)
    piped.close()
    assert made.threads == ["train-pipeline"] + ["MainThread"] * 3
    assert "draws from the global random generators" in caplog.text


def step_outputs(
    collection: ShardedEmbeddingCollection, data: DataReader[Batch], rebuild: bool, carried: list[bool] | None = None
) -> list[Any]:
    """Each step's lookups; ``carried`` says, per batch, whether its features carried an input prepared ahead."""
    outputs = []
    for _ in range(8):
        try:
            batches = next(data)
        except StopIteration:
            data.reset()
            batches = next(data)
        for batch in batches:
            if carried is not None:
                carried.append(batch.sparse.prepared_for(collection) is not None)
            features = SparseFeatures(dict(batch.sparse)) if rebuild else batch.sparse
            looked_up = collection(features)
            sum(output.sum() for output in looked_up.values()).backward()
            outputs.append({name: output.detach() for name, output in looked_up.items()})
    return outputs


@pytest.mark.parametrize("rebuild", [False, True])
def test_ids_prepared_ahead_serve_the_forward_or_stop_when_unused(
    rebuild: bool, caplog: pytest.LogCaptureFixture
) -> None:
    plain = ShardedEmbeddingCollection(TABLES, seed=3)
    piped_collection = ShardedEmbeddingCollection(TABLES, seed=3)
    piped = PipelinedReader(reader(Recorded(), num_accumulate=2), [piped_collection], CPU, GANGS)
    with caplog.at_level(logging.WARNING):
        expected = step_outputs(plain, reader(Recorded(), num_accumulate=2), rebuild=False)
        carried: list[bool] = []
        actual = step_outputs(piped_collection, piped, rebuild, carried)
    piped.close()
    for got, want in zip(actual, expected, strict=True):
        assert got.keys() == want.keys() and all(torch.equal(got[name], want[name]) for name in want)
    # A model that looks up features of its own making gets nothing from the ids sent ahead: a warning, no more sent.
    assert ("ids sent ahead went unused" in caplog.text) == rebuild
    # Every batch carries its prepared input to the forward, unless the forward never took one: then the pipeline
    # stops preparing after the step that showed it (and the step read ahead meanwhile).
    assert carried == [True] * 16 if not rebuild else carried[4:] == [False] * 12


Pair = namedtuple("Pair", ["left", "right"])


def test_tensors_are_mapped_through_a_batchs_structure() -> None:
    ids = JaggedIds(torch.tensor([1, 2]), torch.tensor([0, 1, 2]), torch.tensor([0.5, 1.0]))
    batch = {"batch": Batch(torch.zeros(2), SparseFeatures({"a": ids})), "pair": Pair(torch.ones(1), [torch.ones(1)])}
    batch["name"] = "kept"  # type: ignore[assignment]

    mapped = _map_tensors(batch, lambda tensor: tensor + 1)

    assert torch.equal(mapped["batch"].dense, torch.ones(2))
    assert torch.equal(mapped["batch"].sparse["a"].ids, torch.tensor([2, 3]))
    assert torch.equal(mapped["batch"].sparse["a"].weights, torch.tensor([1.5, 2.0]))
    assert isinstance(mapped["pair"], Pair) and torch.equal(mapped["pair"].right[0], torch.full((1,), 2.0))
    assert mapped["name"] == "kept"


def test_features_changed_in_place_after_they_were_prepared_stop_the_forward() -> None:
    collection = ShardedEmbeddingCollection(TABLES, seed=3)
    piped = PipelinedReader(reader(Recorded()), [collection], CPU, GANGS)
    (batch,) = next(piped)
    collection(batch.sparse)  # prepared ahead, unchanged: used as it is
    (batch,) = next(piped)
    batch.sparse["a"].ids.remainder_(7)  # a model "fixing" ids in place: what was sent ahead is stale

    with pytest.raises(SparseFeatureError, match="must not change in place once a train pipeline has prepared"):
        collection(batch.sparse)
    piped.close()


# When the pipeline runs -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("threads_per_rank", "ranks", "world", "device", "on"),
    [
        (2, 1, 1, "cpu", False),  # the step's threads take both cores: the thread would preempt them
        (1, 2, 2, "cpu", False),
        (1, 1, 1, "cpu", True),  # a core left for the thread
        (1, 2, 4, "cpu", True),  # a second node: the exchange waits on the network
        (2, 1, 1, "cuda", True),  # the step waits on the GPU
    ],
)
def test_auto_runs_the_pipeline_where_its_thread_has_a_core_or_the_step_waits(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    threads_per_rank: int,
    ranks: int,
    world: int,
    device: str,
    on: bool,
) -> None:
    monkeypatch.setattr(threads, "_usable_cores", lambda: {0, 1})
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads_per_rank)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(ranks))
    monkeypatch.setenv("WORLD_SIZE", str(world))

    with caplog.at_level(logging.INFO, logger="recipes.training.pipeline"):
        assert use_pipeline("auto", torch.device(device)) == on
    assert ("Train pipeline: off (trainer.pipeline: auto)" in caplog.text) == (not on)
    assert use_pipeline(True, torch.device("cpu")) and not use_pipeline(False, torch.device(device))
