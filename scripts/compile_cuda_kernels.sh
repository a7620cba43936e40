#!/usr/bin/env bash
# Compile the fused step's CUDA kernels to PTX with the numba-cuda of the GPU machines, on a machine
# with no GPU (see scripts/compile_cuda_kernels.py for why). The first run installs numba-cuda, its
# CUDA bindings and the CUDA compiler's wheels (about 400 MB) into .cuda-compiler/, beside the
# project's virtual environment, not into it: numba-cuda would take numba.cuda's place there.
set -euo pipefail
cd "$(dirname "$0")/.."
target=.cuda-compiler
python=${PYTHON:-.venv/bin/python}
if [ ! -d "$target/numba_cuda" ]; then
    "$python" -m pip install -q --target "$target" --no-deps numba-cuda==0.30.4 "cuda-bindings==12.9.*" \
        cuda-core cuda-pathfinder "nvidia-cuda-nvcc-cu12==12.9.*" "nvidia-cuda-nvrtc-cu12==12.9.*"
fi
export CUDA_HOME=$PWD/$target/nvidia/cuda_nvcc LD_LIBRARY_PATH=$PWD/$target/nvidia/cuda_nvrtc/lib
NUMBA_ENABLE_CUDASIM=0 PYTHONPATH=$PWD/$target:$PWD/src "$python" scripts/compile_cuda_kernels.py
