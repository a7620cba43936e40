"""The profiler, end to end: ``profiler.enabled`` writes a Chrome trace of the chosen training steps
under ``OUTPUT_DIR/tb/profiler``, where TensorBoard's profiler plugin finds it."""

from __future__ import annotations

import json
from pathlib import Path

from support.resume_helpers import check_ok, run_recipes, train_args


def test_the_profiler_writes_a_chrome_trace_of_the_recorded_training_steps(tmp_path: Path) -> None:
    output_dir = tmp_path / "run"
    profiling = ("profiler.enabled=true", "profiler.skip_steps=2", "profiler.record_steps=3")
    check_ok(run_recipes(tmp_path, *train_args(output_dir, *profiling, "trainer.max_num_steps=10")))

    traces = sorted((output_dir / "tb" / "profiler").glob("*.pt.trace.json*"))
    assert len(traces) == 1, traces
    assert traces[0].name.startswith("rank_0")
    trace = json.loads(traces[0].read_text())
    names = {event.get("name", "") for event in trace["traceEvents"]}
    # skip_steps, then one warm-up step, then record_steps recorded steps.
    assert sorted(n for n in names if n.startswith("ProfilerStep#")) == [
        "ProfilerStep#3",
        "ProfilerStep#4",
        "ProfilerStep#5",
    ]
    ops = {n for n in names if n.startswith("aten::")}
    assert {"aten::addmm", "aten::binary_cross_entropy_with_logits"} <= ops, sorted(ops)[:50]
    assert any("backward" in n.lower() for n in names)
