"""Compile the fused step's CUDA kernels to PTX for every sparse optimizer, with no GPU.

numba's CUDA simulator, which the tests use, runs the kernels as Python: it types nothing, so a
kernel that numba-cuda cannot compile passes every test and fails on the first GPU (it happened:
the state tuples' loads compiled for the CPU and the simulator, not for numba-cuda 0.30). This
compiles each kernel for compute capability 9.0 with the numba-cuda of the GPU machines, for every
optimizer, with and without weight decay by frequency, with 32- and 64-bit sort keys, for float32,
float16 and bfloat16 rows.

    bash scripts/compile_cuda_kernels.sh      # installs the compiler wheels once, then runs this
"""

from __future__ import annotations

import re
import sys

import _numba_cuda_redirector  # noqa: F401  (numba.cuda is numba-cuda's, as on the GPU machines)
import numba
import numba.cuda.api
import numba.cuda.dispatcher
import numpy as np
import torch
from numba import cuda

from embedding.kernels import cuda_kernels
from embedding.kernels.common import state_tensors, step_factors, touch_counts
from embedding.kernels.rounding import ROW_DTYPES, kind_of
from embedding.optimizers import SPARSE_OPTIMIZERS, init_optimizer_state, sparse_optimizer_config, spec_of


class _Hopper:
    """Stands for the GPU that device functions ask their compute capability of."""

    compute_capability = (9, 0)


numba.cuda.api.get_current_device = numba.cuda.dispatcher.get_current_device = lambda: _Hopper()


ELEMENTS_PER_LANE = 4
"""A 128-wide row over a warp's 32 lanes."""


def typeof(tensor: torch.Tensor) -> object:
    return numba.typeof(tensor.numpy())


def signatures(name: str, by_frequency: bool, keys: torch.dtype, rows: torch.dtype) -> dict[str, tuple[object, ...]]:
    """The two kernels' argument types, as ``embedding.kernels.cuda.fused_step`` launches them."""
    config = sparse_optimizer_config(name, lr=0.1, weight_decay=0.01 if by_frequency else 0.0,
                                     weight_decay_by_frequency=by_frequency)  # fmt: skip
    spec = spec_of(config)
    weight = torch.zeros(10, 8)
    state = init_optimizer_state(config, 10, 8)
    row_states, element_states = state_tensors(spec, state)
    tables = (
        typeof(weight) if rows == torch.float32 else numba.typeof(np.zeros((10, 8), dtype=np.uint16)),
        numba.typeof(tuple(tensor.numpy() for tensor in row_states)),
        numba.typeof(tuple(tensor.numpy() for tensor in element_states)),
        typeof(touch_counts(spec, state, weight)),
        typeof(torch.zeros(4, dtype=keys)),
        typeof(torch.zeros(4, 8)),
        typeof(torch.zeros(4, dtype=torch.int64)),
        typeof(torch.zeros(1, dtype=torch.int32)),
        numba.int64,
    )
    factors = tuple(numba.typeof(value) for value in step_factors(spec, config, 1, 0.1))
    # The rounding's keys (salts, ends, bases, slot ids) and the step, which every kernel takes.
    keyed = (numba.typeof(np.zeros(1, np.uint64)), *(numba.typeof(np.zeros(1, np.int64)),) * 3, numba.int64)
    factors = (*factors, *keyed)
    positions = typeof(torch.zeros(4, dtype=torch.int64))
    grads, scales = typeof(torch.zeros(4, 8)), typeof(torch.zeros(4))
    units = (positions, positions, positions, scales, numba.boolean, grads, positions, numba.int64)
    return {"units": (*tables, *units, *factors), "long_rows": (*tables, numba.int64, *factors)}


def main() -> int:
    failures = 0
    for name in SPARSE_OPTIMIZERS.names():
        for by_frequency in (False, True):
            spec = spec_of(sparse_optimizer_config(name, weight_decay=0.01, weight_decay_by_frequency=by_frequency))
            per_touch = spec.weight_decay.per_touch if spec.counts_touches else None
            for rows in ROW_DTYPES:
                kernels = dict(zip(("units", "long_rows"), cuda_kernels.compiled(
                    spec.update_element, spec.update_row, spec.weight_decay.apply, per_touch, ELEMENTS_PER_LANE,
                    kind_of(rows),
                )))  # fmt: skip
                for keys in (torch.int32, torch.int64):
                    signature_of = signatures(name, by_frequency, keys, rows)
                    label = f"{name} weight_decay_by_frequency={by_frequency} keys={keys} rows={rows}"
                    failures += compile_each(kernels, signature_of, label)
    print(f"compile_cuda_kernels: {failures} failed")
    return 1 if failures else 0


def compile_each(kernels: dict[str, object], signature_of: dict[str, tuple[object, ...]], label: str) -> int:
    """Compile each kernel to PTX, printing one line each; how many failed."""
    failures = 0
    for kernel_name, signature in signature_of.items():
        try:
            ptx, _ = cuda.compile_ptx(kernels[kernel_name].py_func, signature, cc=(9, 0))
        except Exception as error:  # every kernel is tried; each failure is one line and its cause
            failures += 1
            print(f"FAIL {label} {kernel_name}: {str(error).strip().splitlines()[-1][:300]}")
        else:
            spilled = sum(int(size) for size in re.findall(r"__local_depot\d*\[(\d+)\]", ptx))
            print(f"ok {label} {kernel_name}: {len(ptx):,} characters of PTX, {spilled} bytes of local memory")
    return failures


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
