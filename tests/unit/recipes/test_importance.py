"""Permutation importance: a feature's bags moved across all the split's rows by one seeded permutation, the split
held once and scored again per feature, the determining feature ranked first, the table and its TensorBoard chart."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
from tensorboard.util.tensor_util import make_ndarray
from torch import nn
from torch.nn.functional import binary_cross_entropy_with_logits

from embedding import JaggedIds, SparseFeatures
from gang import FakeGang
from recipes.cli.importance import (
    FeatureImportance,
    ImportanceReport,
    format_table,
    permutation_importance,
    record_chart,
)
from recipes.cli.main import main
from recipes.cli.permutation import Steps, feature_names, hold_split, permuted
from recipes.errors import UserError
from recsys.click.batch import CTRBatch
from recsys.click.units import CTREvalUnit
from recsys.data.memory import InMemoryReader
from support.cli_runs import assert_one_line_error, run_main
from support.signal_noise import NUM_IDS, SignalNoiseData
from units import MetricBag


def held(data: SignalNoiseData, batch_size: int) -> Steps:
    reader = InMemoryReader(data.batch, len(data), batch_size, shuffle=False, drop_last=False)
    return hold_split(reader, "valid")


def bags_of(steps: Steps, feature: str) -> list[list[int]]:
    """Every row's bag of ``feature``, in the split's row order."""
    rows = []
    for batches in steps:
        for batch in batches:
            jagged = batch.sparse[feature]
            rows += [jagged.ids[start:stop].tolist() for start, stop in zip(jagged.offsets, jagged.offsets[1:])]
    return rows


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_a_permuted_feature_gets_the_bags_of_other_rows_of_the_whole_split() -> None:
    steps = held(SignalNoiseData.make(10, seed=3), batch_size=4)
    copy = permuted(steps, "tags", seeded(0))

    order = torch.randperm(10, generator=seeded(0)).tolist()
    before = bags_of(steps, "tags")
    assert bags_of(copy, "tags") == [before[row] for row in order]
    assert any(row >= 4 for row in order[:4]), "the first batch's rows get bags of other batches"
    assert [len(batches) for batches in copy] == [1, 1, 1]
    for old, new in zip([b for s in steps for b in s], [b for s in copy for b in s], strict=True):
        assert new.sparse["signal"] is old.sparse["signal"] and new.sparse["noise"] is old.sparse["noise"]
        assert new.labels is old.labels and new.dense is old.dense
        assert new.sparse["tags"].offsets[0] == 0 and new.sparse["tags"].offsets[-1] == len(new.sparse["tags"].ids)


@dataclass(frozen=True)
class WeightedBatch:
    """A batch of the protocol with weighted bags and no dense field."""

    sparse: SparseFeatures


def test_weights_travel_with_their_ids() -> None:
    ids = torch.tensor([1, 2, 3, 4, 5, 6])
    weights = ids.float() * 10
    batch = WeightedBatch(SparseFeatures({"f": JaggedIds(ids, torch.tensor([0, 1, 3, 3, 6]), weights)}))

    [[copy]] = permuted([[batch]], "f", seeded(1))

    jagged = copy.sparse["f"]
    assert torch.equal(jagged.weights, jagged.ids.float() * 10)  # type: ignore[arg-type]
    assert sorted(jagged.ids.tolist()) == [1, 2, 3, 4, 5, 6]
    assert sorted(jagged.offsets.diff().tolist()) == [0, 1, 2, 3]


def test_a_dense_column_is_permuted_alone_and_dense_columns_are_features() -> None:
    data = SignalNoiseData.make(9, seed=0)
    two_columns = [
        [CTRBatch(torch.stack([b.dense[:, 0], -b.dense[:, 0]], 1), b.sparse, b.labels)] for [b] in held(data, 5)
    ]

    copy = permuted(two_columns, "dense_1", seeded(0))

    assert feature_names(two_columns) == ["signal", "noise", "tags", "dense_0", "dense_1"]
    before, after = (torch.cat([batch.dense for [batch] in steps]) for steps in (two_columns, copy))
    assert torch.equal(after[:, 0], before[:, 0])
    assert torch.equal(after[:, 1], before[torch.randperm(9, generator=seeded(0)), 1])


def test_the_same_seed_gives_the_same_permutation_and_another_seed_another() -> None:
    steps = held(SignalNoiseData.make(50, seed=0), batch_size=16)

    first, again, other = (bags_of(permuted(steps, "noise", seeded(seed)), "noise") for seed in (5, 5, 6))

    assert first == again and first != other


def test_a_split_larger_than_the_memory_budget_is_refused_while_it_is_read() -> None:
    data = SignalNoiseData.make(1000, seed=0)
    reader = InMemoryReader(data.batch, len(data), 100, shuffle=False, drop_last=False)

    with pytest.raises(UserError, match=r"^The test split must fit in a third .* its first 200 rows already take"):
        hold_split(reader, "test", budget=6_000)


def test_batches_that_do_not_offer_their_sparse_features_are_refused() -> None:
    tuples = InMemoryReader(lambda rows: (rows.float(), rows.float()), 8, 4, shuffle=False, drop_last=False)
    with pytest.raises(UserError, match=r"a dataclass with its SparseFeatures in a `sparse` field .* but is a tuple"):
        hold_split(tuples, "valid")

    @dataclass
    class NotFeatures:
        sparse: dict[str, torch.Tensor]

    wrong = InMemoryReader(lambda rows: NotFeatures({"f": rows}), 8, 4, shuffle=False, drop_last=False)
    with pytest.raises(UserError, match="but is a NotFeatures whose `sparse` is a dict instead"):
        hold_split(wrong, "valid")


def test_batches_without_features_or_with_different_ones_are_refused() -> None:
    empty = [[WeightedBatch(SparseFeatures({}))]]
    with pytest.raises(UserError, match="must have sparse or dense features, but has none"):
        feature_names(empty)  # type: ignore[arg-type]
    ids = JaggedIds.from_dense(torch.zeros(2, 1, dtype=torch.int64))
    mixed = [[WeightedBatch(SparseFeatures({"a": ids}))], [WeightedBatch(SparseFeatures({"b": ids}))]]
    with pytest.raises(UserError, match="Every batch of the split must have the same features"):
        feature_names(mixed)  # type: ignore[arg-type]


class Additive(nn.Module):
    """A logit summed from one weight per id of each feature and one of the dense column."""

    def __init__(self) -> None:
        super().__init__()
        self.bags = nn.ModuleDict(
            {
                name: nn.EmbeddingBag(NUM_IDS, 1, mode="sum", include_last_offset=True)
                for name in ("signal", "noise", "tags")
            }
        )
        self.linear = nn.Linear(1, 1)

    def forward(self, batch: CTRBatch) -> torch.Tensor:
        logit = self.linear(batch.dense).squeeze(1)
        for name, bag in self.bags.items():
            logit = logit + bag(batch.sparse[name].ids, batch.sparse[name].offsets).squeeze(1)
        return logit


@pytest.fixture(scope="module")
def trained_unit() -> CTREvalUnit:
    """The additive model trained on 1,024 rows: it learns the signal's weights, and some noise."""
    torch.manual_seed(0)
    model, [[train]] = Additive(), held(SignalNoiseData.make(1024, seed=0), batch_size=1024)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    for _ in range(150):
        optimizer.zero_grad()
        binary_cross_entropy_with_logits(model(train), train.labels).backward()
        optimizer.step()
    return CTREvalUnit(model.eval(), MetricBag(FakeGang()), torch.device("cpu"))


def test_the_feature_that_determines_the_label_drops_the_auc_most_and_noise_not_at_all(
    trained_unit: CTREvalUnit,
) -> None:
    steps = held(SignalNoiseData.make(1000, seed=1), batch_size=64)

    report = permutation_importance(trained_unit, steps, contextlib.nullcontext, seed=0)

    assert report.num_rows == 1000 and report.auc > 0.85
    signal, *others = report.features
    assert signal.feature == "signal"
    assert signal.auc_drop > 0.3 and signal.ne_rise > 0.5
    assert signal.auc == pytest.approx(report.auc - signal.auc_drop)
    for row in others:
        assert abs(row.auc_drop) < 0.02 and abs(row.ne_rise) < 0.05, row
    drops = [row.auc_drop for row in report.features]
    assert drops == sorted(drops, reverse=True)


def test_importance_is_the_same_for_a_seed_and_may_differ_for_another(trained_unit: CTREvalUnit) -> None:
    steps = held(SignalNoiseData.make(300, seed=1), batch_size=64)

    first, again, other = (permutation_importance(trained_unit, steps, contextlib.nullcontext, s) for s in (0, 0, 1))

    assert first == again
    assert (first.auc, first.ne) == (other.auc, other.ne)
    assert {row.feature: row.auc for row in first.features} != {row.feature: row.auc for row in other.features}


REPORT = ImportanceReport(
    seed=0,
    num_rows=1000,
    auc=0.9,
    ne=0.5,
    features=[FeatureImportance("signal", 0.4, 0.6, 0.5, 1.1), FeatureImportance("noise", 0.001, 0.002, 0.899, 0.502)],
    split="valid",
    step=160,
)


def test_the_table_has_the_baseline_and_a_line_per_feature_in_rank_order() -> None:
    lines = format_table(REPORT).splitlines()

    assert lines[0] == "Permutation importance on the valid split (1,000 rows), checkpoint step 160, seed 0"
    assert lines[1] == "baseline: auc=0.900000 ne=0.500000"
    assert lines[2].split() == ["rank", "feature", "auc_drop", "ne_rise"]
    assert [line.split() for line in lines[3:]] == [
        ["1", "signal", "0.400000", "0.600000"],
        ["2", "noise", "0.001000", "0.002000"],
    ]


def tensorboard_view(log_dir: Path, tag: str) -> list[tuple[int, object]]:
    """What TensorBoard's server reads of ``tag`` (its plugins' accumulator, which purges as the server does)."""
    events = EventAccumulator(str(log_dir))
    events.Reload()
    return [(event.step, make_ndarray(event.tensor_proto).item()) for event in events.Tensors(tag)]


def test_the_chart_shows_the_drops_in_rank_order_and_only_the_latest_run(tmp_path: Path) -> None:
    record_chart(str(tmp_path / "importance_valid"), REPORT)
    swapped = FeatureImportance("noise", 0.3, 0.2, 0.6, 0.7), FeatureImportance("signal", 0.1, 0.1, 0.8, 0.6)
    record_chart(str(tmp_path / "importance_valid"), ImportanceReport(1, 1000, 0.9, 0.5, list(swapped), "valid", 160))

    log_dir = tmp_path / "importance_valid"
    assert tensorboard_view(log_dir, "importance/auc_drop") == [(1, pytest.approx(0.3)), (2, pytest.approx(0.1))]
    assert tensorboard_view(log_dir, "importance/ne_rise") == [(1, pytest.approx(0.2)), (2, pytest.approx(0.1))]
    [(step, table)] = tensorboard_view(log_dir, "importance/table/text_summary")
    assert step == 0 and isinstance(table, bytes)
    assert "| 1 | noise | 0.300000 | 0.200000 |" in table.decode() and "seed 1" in table.decode()


def test_importance_refuses_several_processes_and_a_negative_seed(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(capsys, "importance", "runs/anything", "--nproc", "2")
    assert code == 2
    assert_one_line_error(err, "`--nproc` must be left out, but is 2")

    code, _, err = run_main(capsys, "importance", "some_preset", "--seed", "-1")
    assert code == 2
    assert_one_line_error(err, "`--seed` must be a non-negative integer, but is -1 instead.")


def test_the_help_names_the_seed_and_the_table_file(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["importance", "--help"])

    assert info.value.code == 0
    help_text = capsys.readouterr().out
    assert "usage: recipes importance" in help_text and "--seed" in help_text and "-o FILE" in help_text


def test_the_latest_chart_wins_when_two_are_written_in_the_same_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TensorBoard reads a folder's event files in name order: two written in the same second by writers 9 and 10
    of a process named the later one first (``.10`` < ``.9``), and the earlier chart won."""
    from tensorboard.summary.writer import event_file_writer

    monkeypatch.setattr(event_file_writer, "_global_uid", event_file_writer.AtomicCounter(9))
    monkeypatch.setattr(event_file_writer.time, "time", lambda: 1795783426.0)
    record_chart(str(tmp_path / "importance_valid"), REPORT)
    swapped = FeatureImportance("noise", 0.3, 0.2, 0.6, 0.7), FeatureImportance("signal", 0.1, 0.1, 0.8, 0.6)
    record_chart(str(tmp_path / "importance_valid"), ImportanceReport(1, 1000, 0.9, 0.5, list(swapped), "valid", 160))

    assert tensorboard_view(tmp_path / "importance_valid", "importance/auc_drop") == [
        (1, pytest.approx(0.3)),
        (2, pytest.approx(0.1)),
    ]
