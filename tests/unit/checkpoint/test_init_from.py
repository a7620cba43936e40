from __future__ import annotations

import pytest
import torch

from checkpoint import CheckpointError, CheckpointManager, CheckpointNotFoundError, load_model_state_for_init
from gang import FakeGang


def source_model() -> dict[str, torch.Tensor]:
    return {
        "embed.weight": torch.arange(32.0).reshape(8, 4),
        "embed.bias": torch.ones(4),
        "head.weight": torch.full((2, 4), 3.0),
        "head.bias": torch.zeros(2),
    }


def new_model() -> dict[str, torch.Tensor]:
    """A model that shares the embedding but has a wider head and a new layer."""
    return {
        "embed.weight": torch.zeros(8, 4),
        "embed.bias": torch.zeros(4),
        "head.weight": torch.zeros(3, 4),
        "head.bias": torch.zeros(3),
        "extra.weight": torch.zeros(1),
    }


@pytest.fixture
def saved_root(root: str) -> str:
    manager = CheckpointManager(root, FakeGang())
    manager.save(1, {"model": {name: value * 0 for name, value in source_model().items()}})
    manager.save(2, {"model": source_model(), "optimizer": {}})
    return root


def test_include_selects_from_the_last_checkpoint_of_a_root(saved_root: str) -> None:
    state = load_model_state_for_init(saved_root, new_model(), include=["embed.*"])

    assert state.keys() == {"embed.weight", "embed.bias"}
    assert torch.equal(state["embed.weight"], source_model()["embed.weight"])


def test_exclude_drops_matching_names_from_a_step_directory(saved_root: str) -> None:
    state = load_model_state_for_init(f"{saved_root}/step_2", new_model(), include=["embed.*"], exclude=["*.bias"])
    assert state.keys() == {"embed.weight"}


def test_strict_lists_every_offending_key(saved_root: str) -> None:
    with pytest.raises(CheckpointError) as error:
        load_model_state_for_init(saved_root, new_model())

    message = str(error.value)
    assert "missing from the source: ['extra.weight']" in message
    assert "head.bias (2,) vs (3,)" in message and "head.weight (2, 4) vs (3, 4)" in message


def test_non_strict_leaves_out_mismatched_and_unknown_keys(saved_root: str) -> None:
    model = new_model()
    del model["embed.bias"]

    state = load_model_state_for_init(saved_root, model, strict=False)

    assert state.keys() == {"embed.weight"}


def test_unknown_model_key_and_empty_source_are_clear_errors(saved_root: str, tmp_path: object) -> None:
    with pytest.raises(CheckpointError, match=r"one of \['model', 'optimizer'\], but is 'net' instead"):
        load_model_state_for_init(saved_root, new_model(), model_key="net")
    with pytest.raises(CheckpointNotFoundError, match="holds no committed checkpoint"):
        load_model_state_for_init(f"{saved_root}/../elsewhere", new_model())
