#!/usr/bin/env bash
# The whole test suite: lint, types, import rules, and every test (the slow multi-process ones included).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"` for the quick subset.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
export NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-$PWD/.numba_cache}
export WANDB_MODE=offline WANDB_SILENT=true

"$VENV/bin/ruff" check --no-cache src tests benchmarks examples
"$VENV/bin/ruff" format --no-cache --check src tests benchmarks examples
"$VENV/bin/mypy"
"$VENV/bin/lint-imports" --no-logo --no-cache  # The import rules of docs/architecture.md (pyproject.toml).
"$VENV/bin/python" -m pytest -p no:cacheprovider "$@"
