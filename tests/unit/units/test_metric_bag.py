"""MetricBag: named metrics, computed together, reset together, and checkpointed."""

from __future__ import annotations

import io

import pytest
import torch

from gang import FakeGang
from units import BinaryAUC, Mean, MetricBag, Sum
from units.metrics import LogLoss


def make_bag() -> MetricBag:
    bag = MetricBag(FakeGang())
    bag.register("loss", Mean())
    bag.register("count", Sum())
    bag.register("auc", BinaryAUC())
    return bag


def update(bag: MetricBag, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    scores = torch.rand(16, generator=generator)
    labels = (torch.rand(16, generator=generator) < scores).long()
    bag["loss"].update(scores.mean(), weight=16)
    bag["count"].update(16)
    bag["auc"].update(scores, labels)


def test_register_returns_the_metric_and_names_it() -> None:
    bag = MetricBag(FakeGang())
    metric = Mean()

    assert bag.register("loss", metric) is metric
    assert bag["loss"] is metric
    assert "loss" in bag and "other" not in bag
    assert list(make_bag()) == ["loss", "count", "auc"]


def test_register_twice_under_one_name_is_an_error() -> None:
    bag = MetricBag(FakeGang())
    bag.register("loss", Mean())

    with pytest.raises(ValueError, match="'loss' is already registered"):
        bag.register("loss", Sum())


def test_an_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(KeyError, match=r"must be one of \['auc', 'count', 'loss'\], but is 'los' instead"):
        make_bag()["los"]


def test_compute_returns_floats_of_the_metrics_that_saw_data() -> None:
    bag = make_bag()
    bag["loss"].update(torch.tensor(1.0), weight=1)
    bag["loss"].update(torch.tensor(4.0), weight=3)
    bag["count"].update(5)

    values = bag.compute()

    assert values == {"loss": pytest.approx(3.25), "count": pytest.approx(5.0)}
    assert all(type(v) is float for v in values.values())


def test_reset_forgets_everything() -> None:
    bag = make_bag()
    update(bag, seed=0)

    bag.reset()

    assert bag.compute() == {}
    bag["count"].update(2)
    assert bag.compute() == {"count": 2.0}


def test_state_dict_round_trip_gives_the_same_values_and_continues_exactly() -> None:
    uninterrupted = make_bag()
    update(uninterrupted, seed=0)
    state = make_bag()
    update(state, seed=0)
    # Through torch.save/load(weights_only=True), as a checkpoint would take it.
    buffer = io.BytesIO()
    torch.save(state.state_dict(), buffer)
    buffer.seek(0)
    restored = make_bag()

    restored.load_state_dict(torch.load(buffer, weights_only=True))

    assert restored.compute() == uninterrupted.compute()
    update(uninterrupted, seed=1)
    update(restored, seed=1)
    assert restored.compute() == uninterrupted.compute()


def test_state_dict_is_a_copy() -> None:
    bag = make_bag()
    update(bag, seed=0)
    state = bag.state_dict()
    before = bag.compute()

    update(bag, seed=1)
    restored = make_bag()
    restored.load_state_dict(state)

    assert restored.compute() == before


def test_state_dict_of_an_unseen_bag_loads_as_unseen() -> None:
    restored = make_bag()
    update(restored, seed=0)

    restored.load_state_dict(make_bag().state_dict())

    assert restored.compute() == {}


def test_load_state_dict_after_compute_gives_the_loaded_values() -> None:
    source = make_bag()
    update(source, seed=0)
    target = make_bag()
    update(target, seed=1)
    target.compute()  # Caches each metric's value inside torchmetrics.

    target.load_state_dict(source.state_dict())

    assert target.compute() == source.compute()


def test_registered_metrics_and_loaded_states_live_on_the_gangs_device() -> None:
    """A GPU model's outputs meet metrics on the GPU; here the meta device stands in for one."""
    meta = torch.device("meta")
    bag = MetricBag(FakeGang(meta))
    log_loss = bag.register("log_loss", LogLoss())
    assert log_loss.loss_sum.device == meta
    saved = MetricBag(FakeGang())
    saved.register("log_loss", LogLoss()).update(torch.tensor([0.5]), torch.tensor([1.0]))
    bag.load_state_dict(saved.state_dict())
    assert log_loss.loss_sum.device == meta and log_loss.count.device == meta
