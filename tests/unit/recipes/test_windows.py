"""Data in windows as the Trainer runs it (``training.windows``): each window scored, then trained on; checkpoints
every N windows; the window limit; waiting for the next window, and a stop while waiting; the lines that name the
windows waiting for their done-file; the ranks agreeing on the window they start."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.optim.lr_scheduler import LambdaLR

import recipes.training.windows
from gang import FakeGang, Gangs, ReduceOperation
from recipes.config.sections import TrainerSection
from recipes.recorders.jsonl import JsonlRecorder
from recipes.training.checkpoint_schedule import CheckpointSchedule
from recipes.training.data_reader import DataReader
from recipes.training.profiler import Profiler
from recipes.training.protocols import WindowedReader
from recipes.training.trainer import Trainer
from recipes.training.validator import NoopValidator
from recipes.training.windows import next_window, windows_of
from recsys.data.memory import InMemoryReader
from support.linear_regression import FEATURES, TARGETS, Batch, SquaredErrorUnit, linear_model, sequence_validation
from unit.recipes.test_trainer import ListRecorder, RecordingCheckpointer, make_trainer

ROWS_PER_WINDOW = 32  # 4 steps of 8 rows.


class ListWindows(DataReader[Batch]):
    """Windows ``names`` of 32 rows each; with ``follow``, then none yet, asking ``on_wait`` at each look;
    ``not_done``: the windows that wait for their done-file, as the reader names them."""

    def __init__(self, names: list[str], events: list[tuple[str, Any]], follow: bool = False) -> None:
        self.names = names
        self.events = events
        self.follow = follow
        self.index = -1
        self.reader: InMemoryReader[Batch] | None = None
        self.looks = 0
        self.on_wait = lambda: None
        self.not_done = ""

    def _window_reader(self) -> InMemoryReader[Batch]:
        rows = slice(ROWS_PER_WINDOW * (self.index % 2), ROWS_PER_WINDOW * (self.index % 2 + 1))
        features, targets = FEATURES[rows], TARGETS[rows]
        return InMemoryReader(lambda r: (features[r], targets[r]), ROWS_PER_WINDOW, 8, shuffle=False)

    def __next__(self) -> list[Batch]:
        if self.reader is None:
            raise StopIteration
        return next(self.reader)

    def reset(self) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {"index": self.index, "reader": None if self.reader is None else self.reader.state_dict()}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        raise NotImplementedError

    @property
    def window_index(self) -> int:
        return self.index

    @property
    def window_name(self) -> str:
        return self.names[self.index] if self.index >= 0 else ""

    @property
    def poll_interval_s(self) -> float:
        return 0.01

    def next_window_ready(self) -> bool | None:
        self.looks += 1
        if self.index + 1 < len(self.names):
            return True
        self.on_wait()
        return False if self.follow else None

    def next_window_start(self) -> float:
        return float(self.index + 1)

    def start_next_window(self) -> None:
        self.index += 1
        self.reader = self._window_reader()

    def window_scoring_reader(self) -> DataReader[Any]:
        return self._window_reader()

    def waiting_for(self) -> str:
        return "more windows"

    def windows_not_done(self) -> str:
        return self.not_done


class ScoringValidator(NoopValidator):
    def __init__(self, events: list[tuple[str, Any]]) -> None:
        self.events = events

    def score_window(self, step_nr: int, window_index: int, window_name: str, reader: DataReader[Any]) -> None:
        self.events.append(("score", (step_nr, window_index, window_name, sum(1 for _ in reader))))


class StepRecordingUnit(SquaredErrorUnit):
    def __init__(self, events: list[tuple[str, Any]]) -> None:
        super().__init__(linear_model())
        self.events = events

    def __call__(self, batch: Batch) -> torch.Tensor:
        self.events.append(("step", self.step_nr))
        return super().__call__(batch)


def windowed_trainer(
    windows: ListWindows, config: TrainerSection, checkpointer: RecordingCheckpointer, every_n_windows: int | None
) -> Trainer[Batch]:
    unit = StepRecordingUnit(windows.events)
    optimizer = torch.optim.SGD(unit.model.parameters(), lr=0.05)
    gang = FakeGang()
    return Trainer(
        unit=unit,
        data_reader=windows,
        optimizer=optimizer,
        lr_scheduler=LambdaLR(optimizer, lambda step: 1.0),
        gangs=Gangs(root=gang, dp=gang, tp=gang),
        device=torch.device("cpu"),
        config=config,
        recorder=ListRecorder(),
        profiler=Profiler(False, 0, 1, "unused", 0),
        validator=ScoringValidator(windows.events),
        checkpointer=checkpointer,
        checkpoints=CheckpointSchedule(every_n_windows=every_n_windows),
    )


UNLIMITED = TrainerSection(max_num_steps=None, max_num_data_epochs=1)


def test_each_window_is_scored_then_trained_on_and_checkpointed_every_n_windows() -> None:
    events: list[tuple[str, Any]] = []
    checkpointer = RecordingCheckpointer()
    windowed_trainer(ListWindows(["w0", "w1", "w2"], events), UNLIMITED, checkpointer, every_n_windows=2).run()

    steps = [("step", step) for step in range(1, 13)]
    assert events == [
        ("score", (1, 0, "w0", 4)),
        *steps[0:4],
        ("score", (5, 1, "w1", 4)),
        *steps[4:8],
        ("score", (9, 2, "w2", 4)),
        *steps[8:12],
    ]
    assert checkpointer.saves == [(8, False, False), (12, True, False)]
    assert checkpointer.states[8][1]["data_reader"]["index"] == 1


def test_max_num_windows_stops_after_that_many_windows() -> None:
    events: list[tuple[str, Any]] = []
    checkpointer = RecordingCheckpointer()
    config = TrainerSection(max_num_steps=None, max_num_windows=2)
    windowed_trainer(ListWindows(["w0", "w1", "w2"], events), config, checkpointer, every_n_windows=1).run()

    assert [payload[2] for kind, payload in events if kind == "score"] == ["w0", "w1"]
    assert checkpointer.saves == [(4, False, False), (8, True, False)]


def test_a_following_reader_is_waited_for_and_a_stop_while_waiting_saves(caplog: pytest.LogCaptureFixture) -> None:
    events: list[tuple[str, Any]] = []
    checkpointer = RecordingCheckpointer()
    windows = ListWindows(["w0"], events, follow=True)
    trainer = windowed_trainer(windows, UNLIMITED, checkpointer, every_n_windows=None)

    def stop_at_the_third_look() -> None:
        if windows.looks == 3:
            trainer.request_stop()

    windows.on_wait = stop_at_the_third_look
    with caplog.at_level(logging.INFO, logger="recipes.training.windows"):
        trainer.run()

    assert checkpointer.saves == [(4, True, True)]  # A resume point, saved at the stop.
    assert windows.looks == 3
    assert caplog.messages.count("Waiting for the next window after w0: more windows") == 1


WINDOW_W0 = ["Window 0 (w0) starts at step 0.", "Window w0 is done (1 windows so far) at step 4."]
"""The log's lines of a window of 4 steps, the first."""


def windows_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The lines of ``recipes.training.windows`` (another test's run may have let every logger's through)."""
    return [record.getMessage() for record in caplog.records if record.name == "recipes.training.windows"]


def test_the_lines_at_start_while_waiting_and_at_the_end_name_the_windows_waiting_for_their_done_file(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    not_done = "1 window waits for its _SUCCESS file: w1"
    windows = ListWindows(["w0"], [], follow=True)
    windows.not_done = not_done
    trainer = windowed_trainer(windows, UNLIMITED, RecordingCheckpointer(), every_n_windows=None)
    windows.on_wait = lambda: trainer.request_stop() if windows.looks == 3 else None  # After the wait is said.
    with caplog.at_level(logging.INFO, logger="recipes.training.windows"):
        trainer.run()
    windows.follow = False
    with caplog.at_level(logging.INFO, logger="recipes.training.windows"):
        assert next_window(windows, FakeGang(), lambda: False) == "end"

    lines = [
        f"Data in windows: more windows; {not_done}",
        f"Waiting for the next window after w0: more windows; {not_done}",
        f"The data has no more windows to train after w0: training ends; {not_done}",
    ]
    assert windows_lines(caplog) == [lines[0], *WINDOW_W0, *lines[1:]]
    assert capsys.readouterr().err.splitlines() == lines  # On the console too.


def test_without_windows_waiting_the_start_and_the_end_are_in_the_log_only(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    windows = ListWindows(["w0"], [])
    with caplog.at_level(logging.INFO, logger="recipes.training.windows"):
        windowed_trainer(windows, UNLIMITED, RecordingCheckpointer(), every_n_windows=None).run()
    assert windows_lines(caplog) == [
        "Data in windows: more windows",
        *WINDOW_W0,
        "The data has no more windows to train after w0: training ends",
    ]
    assert capsys.readouterr().err == ""


class RankZeroOfTwo(FakeGang):
    """Rank 0 of a gang of 2 whose rank 1 looked as ``looks`` says, one row per collective."""

    def __init__(self, looks: list[list[float]]) -> None:
        super().__init__()
        self.looks = looks

    @property
    def size(self) -> int:
        return 2

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOperation) -> None:
        assert op is ReduceOperation.MAX
        tensor.copy_(torch.maximum(tensor, torch.tensor(self.looks.pop(0), dtype=tensor.dtype)))


def test_the_ranks_start_a_window_only_once_they_found_the_same(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rank 1 found the window of time 5 (one landing), this rank that of time 1: they look again; then both
    found that of time 1."""
    windows = ListWindows(["w0", "w1"], [])
    windows.start_next_window()
    gang = RankZeroOfTwo([[0, 0, 0, 5, -5], [0, 0, 0, 1, -1]])
    with caplog.at_level(logging.INFO, logger="recipes.training.windows"):
        assert next_window(windows, gang, lambda: False) == "started"
    assert (windows.looks, windows.window_name, gang.looks) == (2, "w1", [])
    line = (
        "The ranks found different windows to train next (windows starting from 1970-01-01T00:00:01 to "
        "1970-01-01T00:00:05; one is landing): they look again."
    )
    assert windows_lines(caplog) == [line]
    assert capsys.readouterr().err == f"{line}\n"  # A wait that may last: on the console too.


def test_ranks_that_keep_finding_different_windows_stop_the_run_rather_than_wait_for_ever(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ranks that see different files (node-local copies of the data) would never agree."""
    monkeypatch.setattr(recipes.training.windows, "DISAGREEMENT_LIMIT_S", 3 * ListWindows([], []).poll_interval_s)
    windows = ListWindows(["w0", "w1"], [])
    windows.start_next_window()
    gang = RankZeroOfTwo([[0, 0, 0, 5, -5]] * 3)

    with pytest.raises(RuntimeError) as error:
        next_window(windows, gang, lambda: False)

    assert str(error.value) == (
        "The ranks still found different windows to train next after 0.03 s (windows starting from "
        "1970-01-01T00:00:01 to 1970-01-01T00:00:05): every rank must see the same files of the data (a filesystem "
        "that all the nodes share)."
    )
    assert (windows.looks, gang.looks) == (3, [])


def test_the_end_of_the_windows_ends_the_wait() -> None:
    windows = ListWindows([], [])
    assert next_window(windows, FakeGang(), lambda: False) == "end"
    assert windows_of(windows) is windows
    assert isinstance(windows, WindowedReader)


def test_a_plain_reader_has_no_windows() -> None:
    assert windows_of(make_trainer(UNLIMITED).state.reader) is None


def test_eval_units_score_a_window_and_jsonl_names_it(tmp_path: Path) -> None:
    from recipes.training.validator import WINDOW_RUN, make_validator

    model = linear_model()
    recorder = JsonlRecorder(str(tmp_path))
    validator = make_validator([sequence_validation(model, [0.25, 0.5])], model, recorder, 0, nullcontext)
    data = InMemoryReader(lambda r: (FEATURES[r], TARGETS[r]), 8, 8, shuffle=False)
    validator.score_window(5, 1, "2026-11-27T14", data)

    row = json.loads((tmp_path / f"{WINDOW_RUN}.jsonl").read_text())
    assert row == {"step": 5, "window": "2026-11-27T14", "score": 0.25, "window_index": 1.0}
