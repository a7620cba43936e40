"""The ``csv_log`` recorder: every published metric as a line ``run,step,metric,value`` of a CSV file."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from recipes.recorders import RECORDERS, MetricRecorder, RecorderConfig, RecorderContext


@dataclass
class CsvLogConfig(RecorderConfig):
    enabled: bool = False
    file_name: str = "metrics.csv"
    """The file, in the output directory."""


class CsvLogRecorder(MetricRecorder):
    def __init__(self, path: str) -> None:
        self._file = open(path, "a")  # noqa: SIM115 (closed in close())

    def record(self, run: str, step_nr: int, values: Mapping[str, float]) -> None:
        self._file.writelines(f"{run},{step_nr},{name},{value}\n" for name, value in values.items())
        self._file.flush()

    def close(self) -> None:
        self._file.close()


@RECORDERS.register("csv_log", CsvLogConfig)
def csv_log(config: CsvLogConfig, context: RecorderContext) -> MetricRecorder:
    return CsvLogRecorder(os.path.join(context.output_dir, config.file_name))
