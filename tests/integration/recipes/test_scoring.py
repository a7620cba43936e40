"""``eval`` and ``predict`` build what scoring needs and nothing of training: no optimizer, no optimizer state."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from recipes.cli import scoring
from recipes.cli.job import BuiltParts
from recipes.cli.job_spec import JobSpec
from recipes.cli.main import main


@pytest.fixture
def trained(isolated_presets: Path) -> Path:
    """A short ``ctr_tiny`` run whose tables were trained by Adam, which keeps two states per element."""
    args = ["train", "ctr_tiny", "-o", "run", "trainer.max_num_steps=4", "metrics.recorders.console=false"]
    assert main([*args, "model.embeddings.sparse_optimizer=adam"]) == 0
    return isolated_presets / "run"


def test_scoring_allocates_the_tables_rows_and_no_optimizer_state(
    trained: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[BuiltParts] = []
    build_parts = scoring.build_parts

    def recording(*args: Any, **kwargs: Any) -> BuiltParts:
        built.append(build_parts(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(scoring, "build_parts", recording)
    results = scoring.score(JobSpec(str(trained / "config.yaml"), str(trained)), "last")

    assert "auc" in results["valid"]
    [parts] = built
    shards = [shard for collection in parts.tables.values() for shard in collection.shards.values()]
    rows_bytes = sum(shard.num_rows * shard.config.dim * 4 for shard in shards)
    held = sum(group.weight.nbytes for collection in parts.tables.values() for group in collection.groups)
    held += sum(t.nbytes for c in parts.tables.values() for g in c.groups for t in g.optimizer_state.values())
    assert shards and held == rows_bytes
    assert all(not shard.optimizer_state for shard in shards)


def test_eval_of_the_test_split_records_its_metrics_under_the_splits_name(
    isolated_presets: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Once recorded as ``eval_valid``, among the validation's own metrics."""
    args = ["dataset.synthetic_rows=2000", "trainer.max_num_steps=3", "metrics.recorders.console=false"]
    assert main(["train", "dlrm_criteo_tiny", "-o", "run", *args]) == 0
    capsys.readouterr()

    assert main(["eval", "run", "--split", "test"]) == 0

    out = capsys.readouterr().out
    assert out.startswith("test: auc=")
    run = isolated_presets / "run"
    assert sorted(path.name for path in (run / "metrics").glob("eval_*.jsonl")) == ["eval_test.jsonl"]
    [row] = [json.loads(line) for line in (run / "metrics" / "eval_test.jsonl").read_text().splitlines()]
    assert row["step"] == 3 and 0 <= row["auc"] <= 1
    assert sorted(path.name for path in (run / "tb").glob("eval_*")) == ["eval_test"]
    assert any((run / "tb" / "eval_test").iterdir())
