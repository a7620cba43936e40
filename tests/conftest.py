"""Test-wide settings that must be in place before numba or torch is first imported."""

import os

# The CUDA kernels run under numba's simulator on machines without a GPU; it must be
# switched on before numba is imported anywhere.
os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
# Forked DataLoader workers die after a parallel numba kernel under the OpenMP layer.
os.environ.setdefault("NUMBA_THREADING_LAYER", "workqueue")
os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".numba_cache"))
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
