"""``export`` in this process: the delta of two tables, the refusals before any work, and every zoo model's dense part
exported by ``torch.export`` scoring as the model does. Real runs exported and scored: the integration test."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from gang import FakeGang
from recipes.cli.export import _candidates, _delta, _dense_for_serving
from recipes.cli.export_tables import TableRows
from recipes.errors import UserError
from recipes.serving.servable import ServableModel
from recsys.zoo import ZOO_MODELS, build_zoo_model
from support.cli_runs import assert_one_line_error, run_main
from support.zoo_data import FEATURES, NUM_DENSE, TABLES, ZOO_MODEL_NAMES, XorData


def test_a_delta_holds_new_and_changed_rows_and_the_evicted_ids() -> None:
    old_ids = np.array([1, 3, 5, 7], dtype=np.int64)
    old_rows = np.array([[1, 1], [3, 3], [5, 5], [7, 7]], dtype=np.float32)
    ids = np.array([1, 2, 5, 7], dtype=np.int64)
    rows = np.array([[1, 1], [2, 2], [5, 5.5], [7, 7]], dtype=np.float32)

    changed_ids, changed_rows, evicted = _delta(ids, rows, old_ids, old_rows)

    assert changed_ids.tolist() == [2, 5]
    assert changed_rows.tolist() == [[2, 2], [5, 5.5]]
    assert evicted.tolist() == [3]


def test_with_the_checkpoints_change_tracking_only_the_rows_it_lists_are_compared() -> None:
    old_ids = np.array([1, 3, 5], dtype=np.int64)
    old_rows = np.array([[1, 1], [3, 3], [5, 5]], dtype=np.float32)
    ids = np.array([1, 2, 5], dtype=np.int64)
    rows = np.array([[1, 1.5], [2, 2], [5, 5.5]], dtype=np.float32)  # id 1's row says what the tracking would miss
    exported = TableRows("hash", 2, base_step=3, changed_ids=[np.array([2, 5], dtype=np.int64)])

    candidates = _candidates(exported, None, since=3)
    changed_ids, _, evicted = _delta(ids, rows, old_ids, old_rows, candidates)

    assert changed_ids.tolist() == [2, 5] and evicted.tolist() == [3]
    assert _candidates(exported, None, since=2) is None  # a delta over another step than --since's
    over_same_base = TableRows("hash", 2, base_step=3, changed_ids=[np.array([1], dtype=np.int64)])
    assert sorted(_candidates(exported, over_same_base, since=4).tolist()) == [1, 2, 5]  # type: ignore[union-attr]
    assert _candidates(TableRows("fixed", 2, base_step=3, changed_ids=None), None, since=3) is None  # a whole piece


def test_a_delta_over_no_table_holds_every_row() -> None:
    ids, rows = np.array([4, 9], dtype=np.int64), np.ones((2, 3), dtype=np.float32)

    changed_ids, changed_rows, evicted = _delta(ids, rows, np.zeros(0, np.int64), None)

    assert changed_ids.tolist() == [4, 9] and changed_rows.shape == (2, 3) and evicted.tolist() == []


def test_a_model_without_a_dense_part_is_refused_saying_what_it_needs() -> None:
    with pytest.raises(UserError, match=r"Linear does not: it needs a `dense_for_serving\(\)` method returning"):
        _dense_for_serving(nn.Linear(2, 1))


def test_a_missing_run_and_a_non_empty_output_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_main(capsys, "export", str(tmp_path / "none"), "-o", str(tmp_path / "a"))
    assert code == 2
    assert_one_line_error(err, "OUTPUT_DIR must be a run's output directory", "has no config.yaml")

    (tmp_path / "run").mkdir()
    (tmp_path / "run/config.yaml").write_text("")
    (tmp_path / "full").mkdir()
    (tmp_path / "full/x").write_text("")
    code, _, err = run_main(capsys, "export", str(tmp_path / "run"), "-o", str(tmp_path / "full"))
    assert code == 2
    assert_one_line_error(err, "`-o` must be a new or empty folder, but", "is not empty")
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("name", ZOO_MODEL_NAMES)
def test_every_zoo_model_exports_a_dense_part_that_scores_as_the_model(name: str) -> None:
    config = ZOO_MODELS.get(name).config_class(name=name)
    model = build_zoo_model(config, TABLES, FEATURES, NUM_DENSE, FakeGang(), seed=1).eval()
    assert isinstance(model, ServableModel)
    batch = XorData.make(16, seed=2).batch(torch.arange(16))
    with torch.no_grad():
        expected = torch.sigmoid(model(batch))
        split = model.dense_for_serving()
        lookups = {id(module): module(batch.sparse) for module, _ in model.lookups().values()}
        tables = {table.name: module for module, _ in model.lookups().values() for table in module.tables}
        pooled = [lookups[id(tables[p.table])][p.feature] for p in split.inputs]
        program = torch.export.export(split.module, (batch.dense, pooled), strict=False).module()

        assert split.num_dense == NUM_DENSE
        assert {p.feature for p in split.inputs} == set(FEATURES)
        assert {p.pooling for p in split.inputs if p.feature == "tags"} == {"mean"}
        torch.testing.assert_close(split.module(batch.dense, pooled), expected, rtol=0, atol=0)
        torch.testing.assert_close(program(batch.dense, pooled), expected, rtol=1e-6, atol=1e-6)
