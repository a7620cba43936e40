#!/usr/bin/env bash
# The whole test suite: lint, types, import rules, then both test trees: tests/unit (one process each, seconds in
# all) and tests/integration (processes, files and end-to-end runs; every test there is marked `slow`).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"` for the unit tests alone, or a path.
# The tests run on pytest-xdist workers, one more than the cores and at most 4, as the integration tests wait on
# their processes part of the time (TEST_WORKERS=N sets N; 0 runs them in this
# process, as `--pdb` needs); each test file runs whole on one worker, so a module's fixtures are made once. Files
# go out in collection order, the integration files (few tests, minutes each) first and the many short unit files
# last, where they fill the workers' ends; xdist's default, most tests first, left a heavy file running alone.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
export NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-$PWD/.numba_cache}
export WANDB_MODE=offline WANDB_SILENT=true

"$VENV/bin/ruff" check --no-cache src tests benchmarks examples docs_hooks setup.py
"$VENV/bin/ruff" format --no-cache --check src tests benchmarks examples docs_hooks setup.py
"$VENV/bin/mypy"
"$VENV/bin/lint-imports" --no-logo --no-cache  # The import rules of docs/architecture.md (pyproject.toml).
WORKERS=${TEST_WORKERS:-$(( $(nproc) + 1 < 4 ? $(nproc) + 1 : 4 ))}
"$VENV/bin/python" -m pytest -p no:cacheprovider -n "$WORKERS" --dist loadfile --no-loadscope-reorder "$@"
