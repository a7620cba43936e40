"""Recorders: JSONL lines, and TensorBoard scalars read back by TensorBoard (an offline WandB run of a real
training: tests/integration/recipes/recorders/test_recorders.py)."""

from __future__ import annotations

import errno
import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from fsspec.implementations.local import LocalFileSystem
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.summary.writer.record_writer import RecordWriter

from gang import FakeGang, Gangs
from recipes.checkpointing.run_checkpoints import set_earlier_metrics_aside
from recipes.config.sections import MetricsSection
from recipes.errors import UserError, WriteError
from recipes.recorders import RECORDERS, CompositeRecorder, MetricRecorder
from recipes.recorders.base import flatten
from recipes.recorders.jsonl import JsonlRecorder
from recipes.recorders.tensorboard import TensorBoardRecorder


def test_jsonl_appends_one_object_per_record_per_run(tmp_path: Path, read_jsonl: Any) -> None:
    recorder = JsonlRecorder(str(tmp_path / "metrics"))

    recorder.record("train", 10, {"loss": 0.5})
    recorder.record("valid", 10, {"auc": 0.7})
    recorder.record("train", 20, {"loss": 0.25, "lr": 1e-3})
    recorder.close()

    assert read_jsonl(tmp_path / "metrics" / "train.jsonl") == [
        {"step": 10, "loss": 0.5},
        {"step": 20, "loss": 0.25, "lr": 1e-3},
    ]
    assert read_jsonl(tmp_path / "metrics" / "valid.jsonl") == [{"step": 10, "auc": 0.7}]


def test_jsonl_on_resume_drops_the_lines_after_the_resume_step(tmp_path: Path, read_jsonl: Any) -> None:
    first = JsonlRecorder(str(tmp_path))
    for step in (10, 20, 30):
        first.record("train", step, {"loss": float(step)})
    first.record("valid", 20, {"auc": 0.5})
    first.record("valid", 30, {"auc": 0.6})

    resumed = JsonlRecorder(str(tmp_path), resume_step=20)
    resumed.record("train", 30, {"loss": 3.0})

    assert [row["step"] for row in read_jsonl(tmp_path / "train.jsonl")] == [10, 20, 30]
    assert read_jsonl(tmp_path / "train.jsonl")[-1]["loss"] == 3.0
    assert read_jsonl(tmp_path / "valid.jsonl") == [{"step": 20, "auc": 0.5}]


def test_jsonl_on_resume_drops_a_torn_last_line_naming_the_file(
    tmp_path: Path, read_jsonl: Any, caplog: pytest.LogCaptureFixture
) -> None:
    first = JsonlRecorder(str(tmp_path))
    for step in (10, 20, 30):
        first.record("train", step, {"loss": float(step)})
    with (tmp_path / "train.jsonl").open("a") as f:
        f.write('{"step": 40, "lo')  # Killed while writing this line.

    with caplog.at_level(logging.WARNING):
        resumed = JsonlRecorder(str(tmp_path), resume_step=30)
    resumed.record("train", 40, {"loss": 40.0})

    assert read_jsonl(tmp_path / "train.jsonl") == [{"step": s, "loss": float(s)} for s in (10, 20, 30, 40)]
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "torn last line 4" in warning and str(tmp_path / "train.jsonl") in warning


def test_jsonl_on_resume_keeps_a_whole_last_line_that_lost_only_its_newline(tmp_path: Path, read_jsonl: Any) -> None:
    (tmp_path / "train.jsonl").write_text('{"step": 10, "loss": 1.0}\n{"step": 20, "loss": 2.0}')

    JsonlRecorder(str(tmp_path), resume_step=20).record("train", 30, {"loss": 3.0})

    assert [row["step"] for row in read_jsonl(tmp_path / "train.jsonl")] == [10, 20, 30]


def test_jsonl_on_resume_refuses_a_broken_line_before_the_last_naming_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "train.jsonl").write_text('{"step": 10}\nnot json\n{"step": 30}\n')

    with pytest.raises(UserError, match=r"Line 2 of \S+train\.jsonl must be a JSON object with an integer step"):
        JsonlRecorder(str(tmp_path), resume_step=30)


class Killed(BaseException):
    """A kill -9, as far as the code under test can tell: nothing after it runs."""


def test_a_kill_while_a_resume_rewrites_the_jsonl_loses_no_row(
    tmp_path: Path, read_jsonl: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file was once truncated and rewritten in place: a kill then left it empty, its rows gone for good."""
    first = JsonlRecorder(str(tmp_path))
    for step in (10, 20, 30):
        first.record("train", step, {"loss": float(step)})
    rows = read_jsonl(tmp_path / "train.jsonl")
    opened = LocalFileSystem.open

    def killed_while_rewriting(fs: LocalFileSystem, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if mode != "w":  # (Text mode opens again in "wb".)
            return opened(fs, path, mode, **kwargs)
        with opened(fs, path, mode, **kwargs) as file:
            file.write('{"step": 10, "lo')
        raise Killed

    with monkeypatch.context() as patched:
        patched.setattr(LocalFileSystem, "open", killed_while_rewriting)
        with pytest.raises(Killed):
            JsonlRecorder(str(tmp_path), resume_step=20)

    assert read_jsonl(tmp_path / "train.jsonl") == rows
    assert sorted(path.name for path in tmp_path.iterdir()) == ["train.jsonl", "train.jsonl.rewrite"]

    JsonlRecorder(str(tmp_path), resume_step=20).record("train", 30, {"loss": 3.0})

    assert read_jsonl(tmp_path / "train.jsonl") == [*rows[:2], {"step": 30, "loss": 3.0}]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["train.jsonl"]  # The stale rewrite is gone.


def test_a_full_disk_while_writing_a_jsonl_line_is_a_write_error_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = JsonlRecorder(str(tmp_path / "metrics"))

    def full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(LocalFileSystem, "open", full)

    with pytest.raises(WriteError) as raised:
        recorder.record("train", 10, {"loss": 0.5})

    path = tmp_path / "metrics" / "train.jsonl"
    assert str(raised.value) == f"Could not write {path}: [Errno 28] No space left on device."


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # The writer thread's, said again.
def test_a_full_disk_under_the_tensorboard_writer_is_a_write_error_naming_the_run_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The writer's thread meets the error; the recorder says it in one line, with no thread traceback."""

    def full(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(RecordWriter, "write", full)
    recorder = TensorBoardRecorder(str(tmp_path / "tb"))

    with pytest.raises(WriteError) as raised:
        for step in range(1, 4):  # The thread's error surfaces at the flush after it.
            recorder.record("train", step, {"loss": 2.0})

    assert str(raised.value) == f"Could not write {tmp_path / 'tb'}/train: [Errno 28] No space left on device."
    # The failed thread reports its error after the recorder has raised; let it finish here, not in the next test.
    for thread in threading.enumerate():
        if getattr(thread, "exception", None) is not None:
            thread.join()
    assert "Traceback" not in capfd.readouterr().err


def test_a_fresh_start_in_a_used_output_directory_moves_the_earlier_metrics_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gangs = Gangs(FakeGang(), FakeGang(), FakeGang())
    for attempt in (1, 2):
        recorder = TensorBoardRecorder(str(tmp_path / "tb"))
        recorder.record("train", 4, {"loss": float(attempt)})
        recorder.close()
        JsonlRecorder(str(tmp_path / "metrics")).record("train", 4, {"loss": float(attempt)})
        with caplog.at_level(logging.WARNING):
            set_earlier_metrics_aside(str(tmp_path), None, gangs)

    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.old-1", "metrics.old-2", "tb.old-1", "tb.old-2"]
    for attempt in (1, 2):
        assert (tmp_path / f"metrics.old-{attempt}" / "train.jsonl").read_text() == (
            f'{{"step": 4, "loss": {float(attempt)}}}\n'
        )
        events = EventAccumulator(str(tmp_path / f"tb.old-{attempt}" / "train"))
        events.Reload()
        assert [(e.step, e.value) for e in events.Scalars("loss")] == [(4, float(attempt))]
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name == "recipes.checkpointing.run_checkpoints"
    ]
    assert len(warnings) == 2 and "metrics/ and tb/" in warnings[0] and "metrics.old-1/" in warnings[0]


def test_a_resumed_run_or_another_rank_leaves_the_metrics_where_they_are(tmp_path: Path) -> None:
    JsonlRecorder(str(tmp_path / "metrics")).record("train", 4, {"loss": 1.0})

    set_earlier_metrics_aside(str(tmp_path), object(), Gangs(FakeGang(), FakeGang(), FakeGang()))  # type: ignore[arg-type]

    class Rank1(FakeGang):
        @property
        def rank(self) -> int:
            return 1

    set_earlier_metrics_aside(str(tmp_path), None, Gangs(Rank1(), Rank1(), Rank1()))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics"]


def test_jsonl_writes_through_fsspec(read_jsonl: Any) -> None:
    import fsspec

    recorder = JsonlRecorder("memory://recorder_test/metrics")
    recorder.record("train", 1, {"loss": 2.0})

    with fsspec.open("memory://recorder_test/metrics/train.jsonl", "r") as f:
        assert f.read() == '{"step": 1, "loss": 2.0}\n'


def test_tensorboard_scalars_read_back_per_run_with_the_same_tags(tmp_path: Path) -> None:
    recorder = TensorBoardRecorder(str(tmp_path / "tb"))

    recorder.record_config({"trainer": {"max_num_steps": 5, "score_metric": None}, "optimizer": {"betas": [0.9]}})
    recorder.record("train", 1, {"loss": 2.0})
    recorder.record("train", 2, {"loss": 1.5})
    recorder.record("valid", 2, {"loss": 1.75, "auc": 0.6})
    recorder.close()

    train = EventAccumulator(str(tmp_path / "tb" / "train"))
    train.Reload()
    valid = EventAccumulator(str(tmp_path / "tb" / "valid"))
    valid.Reload()
    assert [(e.step, e.value) for e in train.Scalars("loss")] == [(1, 2.0), (2, 1.5)]
    assert [(e.step, e.value) for e in valid.Scalars("loss")] == [(2, 1.75)]
    assert [(e.step, pytest.approx(e.value)) for e in valid.Scalars("auc")] == [(2, pytest.approx(0.6))]


def test_flatten_joins_keys_with_dots_and_stringifies_lists() -> None:
    assert flatten({"a": {"b": 1, "c": {"d": None}}, "e": [1, 2], "f": "x"}) == {
        "a.b": 1,
        "a.c.d": None,
        "e": "[1, 2]",
        "f": "x",
    }


class ListRecorder(MetricRecorder):
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def record(self, run: str, step_nr: int, values: Mapping[str, float]) -> None:
        self.calls.append(("record", run, step_nr, dict(values)))

    def record_config(self, config: Mapping[str, Any]) -> None:
        self.calls.append(("config", dict(config)))

    def close(self) -> None:
        self.calls.append(("close",))


def test_composite_forwards_every_call_to_every_recorder() -> None:
    recorders = [ListRecorder(), ListRecorder()]
    composite = CompositeRecorder(recorders)

    composite.record_config({"seed": 1})
    composite.record("train", 3, {"loss": 1.0})
    composite.close()

    expected = [("config", {"seed": 1}), ("record", "train", 3, {"loss": 1.0}), ("close",)]
    assert recorders[0].calls == recorders[1].calls == expected


def a_recorder_of(module: str) -> Any:
    """A recorder factory as a module ``module`` would define it."""

    def factory(config: Any, context: Any) -> MetricRecorder:
        return CompositeRecorder([])

    factory.__module__ = module
    return factory


def test_the_default_recorders_are_those_of_the_folder_each_on_as_its_config_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(RECORDERS, "_components", dict(RECORDERS._components))
    RECORDERS.register("new_in_folder")(a_recorder_of("recipes.recorders.new_in_folder"))
    RECORDERS.register("elsewhere")(a_recorder_of("a_package.recorders"))

    defaults = MetricsSection().recorders

    assert {name: config.enabled for name, config in defaults.items()} == {
        "console": True,
        "jsonl": True,
        "new_in_folder": True,
        "tensorboard": True,
        "wandb": False,
    }
