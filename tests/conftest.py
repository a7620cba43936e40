"""Settings and fixtures of both trees: ``tests/unit`` (one process, no end-to-end run) and ``tests/integration``
(processes, files, end-to-end runs; every test there is marked ``slow``, so ``-m "not slow"`` is the unit tree).

The environment below must be in place before numba or torch is first imported."""

import os

# The CUDA kernels run under numba's simulator on machines without a GPU; it must be
# switched on before numba is imported anywhere.
os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
# Forked DataLoader workers die after a parallel numba kernel under the OpenMP layer.
os.environ.setdefault("NUMBA_THREADING_LAYER", "workqueue")
# torch's OpenMP threads spin for milliseconds after each parallel region, on cores that the other test workers and
# their ranks share (2 cores, 3 workers): a run of 200 steps on 2 threads spent 12% more CPU spinning. Waiting
# passively, they give the core back at once. Every process the tests start inherits it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".numba_cache"))
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")

import importlib.metadata
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from recipes.config import presets

pytest_plugins = ["support.fixtures"]  # Fixtures of both trees beyond this file's.


@pytest.fixture
def isolated_presets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Run in an empty working directory with no extra preset files, and undo any registration.

    Presets then come from the project's recipes.yaml only, until the test writes a
    ``recipes.yaml`` into the returned folder, sets ``$RECIPES_PRESET_FILES`` or registers one
    from Python. Modules imported from that folder are forgotten afterwards, so tests may reuse names.
    """
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(presets.PRESET_FILES_ENV, raising=False)
    monkeypatch.setattr(presets, "_python_presets", dict(presets._python_presets))
    # Register every installed recipe before taking the snapshot: one first imported inside the test would register
    # into the snapshot only, and its module, imported for good, would not register it again for a later test.
    for entry_point in importlib.metadata.entry_points(group=presets.RECIPE_ENTRY_POINTS):
        presets.get_recipe(entry_point.name)
    monkeypatch.setattr(presets, "_recipes", dict(presets._recipes))
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield tmp_path
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]


ReadJsonl = Callable[[Path], list[dict[str, Any]]]


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="session")
def read_jsonl() -> ReadJsonl:
    """``read_jsonl(path)``: the objects of a JSON-lines file, one per line."""
    return _read_jsonl


TESTS = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # Before `-m` deselects by marker.
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every integration test ``slow``; refuse a unit test marked so (it belongs in ``tests/integration``)."""
    for item in items:
        if item.path.is_relative_to(TESTS / "integration"):
            item.add_marker(pytest.mark.slow)
        elif item.path.is_relative_to(TESTS / "unit") and item.get_closest_marker("slow"):
            raise pytest.UsageError(
                f"{item.nodeid} is marked slow: an integration test, it belongs in tests/integration"
            )


def pytest_sessionstart(session: pytest.Session) -> None:
    """Fill numba's kernel cache before the workers start (``support.numba_warmup``), where integration tests run:
    in the process that runs the tests, or xdist's controller, never in a worker."""
    config = session.config
    if hasattr(config, "workerinput") or "not slow" in (config.option.markexpr or ""):
        return
    integration = TESTS / "integration"
    paths = [Path(arg.split("::")[0]).resolve() for arg in config.args] or [TESTS]
    if not any(path == integration or integration in path.parents or path in integration.parents for path in paths):
        return
    from support.numba_warmup import cache_is_empty, warm_up

    if not cache_is_empty():
        return  # Filled by an earlier run: a changed kernel is compiled by its first test alone.
    failed = warm_up()
    if failed:
        print(f"numba warm-up: {', '.join(failed)} did not train; their tests will say why.", file=sys.stderr)


@pytest.fixture(autouse=True)
def environment_restored() -> Iterator[None]:
    """Each test starts from the environment the tests were collected with. The code a test runs in this process
    may set variables for the processes it would start (torch sets ``TORCHINDUCTOR_CACHE_DIR`` at its first
    compiled step); kept, they would reach the processes of every later test of the worker, depending on which
    tests ran there before, and make those runs differ from the warm interpreter's (``support.warm_runs``)."""
    saved = dict(os.environ)
    yield
    for name in set(os.environ) - set(saved) - {PYTEST_VARIABLE}:
        del os.environ[name]
    for name, value in saved.items():
        if name != PYTEST_VARIABLE and os.environ.get(name) != value:
            os.environ[name] = value


PYTEST_VARIABLE = "PYTEST_CURRENT_TEST"  # pytest's own, which it sets and removes around each test.
