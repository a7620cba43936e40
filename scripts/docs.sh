#!/usr/bin/env bash
# Build the documentation site (mkdocs.yml) into site/, or into the folder given as the first argument, with every
# warning an error: a broken link or anchor, a page left out of the nav, a config field without a docstring, a
# docstring the API reference cannot read. `.venv/bin/mkdocs serve` shows it while you write.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
export NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-$PWD/.numba_cache}
export NO_MKDOCS_2_WARNING=1  # Material's notice about MkDocs 2.0, which is no warning about these docs.

"$VENV/bin/mkdocs" build --strict --clean --site-dir "${1:-site}"
