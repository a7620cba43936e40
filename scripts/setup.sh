#!/usr/bin/env bash
# Set up a virtual environment with the project, its dev tools and the documentation tools (scripts/docs.sh).
#
# torch is installed first, and only when missing, so that pip never resolves a CUDA build
# of torch on a CPU-only machine. Override what is installed with:
#   TORCH_SPEC       the torch requirement (default: the tested version, torch==2.13.0)
#   TORCH_INDEX_URL  an index to take it from, e.g. https://download.pytorch.org/whl/cpu
#   VENV             where the environment goes (default: .venv)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  echo "Installing $TORCH_SPEC ..."
  "$VENV/bin/python" -m pip install -q "$TORCH_SPEC" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
fi
"$VENV/bin/python" -m pip install -q -e ".[dev,docs]"
echo "Ready: $VENV/bin/python -m recipes --help"
