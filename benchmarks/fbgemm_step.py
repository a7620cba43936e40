"""FBGEMM's CPU table-batched embedding with exact row-wise Adagrad, as ``sparse_step.py`` times our step beside it.

``fbgemm-gpu-cpu`` (the optional extra ``bench``: 1.8.0 imports with torch 2.13.0) is not a dependency: without it
:func:`fbgemm_step` returns ``None`` and the benchmark says so. The step is the same as ours: the batch's ids in
FBGEMM's layout (table-major bags of one id), the forward pooling every feature, backward from the same upstream
gradients, which applies the update inside the backward pass (FBGEMM fuses it there), on host memory rows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch


def fbgemm_available() -> bool:
    """Whether FBGEMM's table-batched embeddings import."""
    try:
        import fbgemm_gpu.split_table_batched_embeddings_ops_training  # noqa: F401
    except (ImportError, OSError, RuntimeError):
        return False
    return True


def fbgemm_step(
    table_rows: Sequence[int],
    dim: int,
    feature_table: Sequence[int],
    feature_ids: Sequence[torch.Tensor],
    upstream: Sequence[torch.Tensor],
    learning_rate: float = 0.01,
) -> Callable[[], None] | None:
    """One step of FBGEMM's CPU kernels: tables of ``table_rows`` rows of ``dim`` in float32 on the host, feature
    ``f`` looked up in table ``feature_table[f]`` with ``feature_ids[f]`` (one id a sample), backward from
    ``upstream[f]``; ``None`` when FBGEMM does not import."""
    if not fbgemm_available():
        return None
    from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    module = SplitTableBatchedEmbeddingBagsCodegen(
        [(rows, dim, EmbeddingLocation.HOST, ComputeDevice.CPU) for rows in table_rows],
        feature_table_map=list(feature_table),
        optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        weights_precision=SparseType.FP32,
        learning_rate=learning_rate,
        eps=1e-8,
    )
    batch = feature_ids[0].numel()
    indices = torch.cat([ids.reshape(-1) for ids in feature_ids]).long()
    offsets = torch.arange(indices.numel() + 1, dtype=torch.long)
    # The forward's output is [batch, features x dim], feature f in columns f * dim onwards.
    grad = torch.cat([gradient.reshape(batch, dim) for gradient in upstream], dim=1).contiguous()

    def step() -> None:
        module(indices, offsets).backward(grad)

    return step


def fbgemm_layout_step(
    tables: Mapping[str, tuple[int, Sequence[str]]],
    dim: int,
    feature_ids: Mapping[str, torch.Tensor],
    upstream: Mapping[str, torch.Tensor],
) -> Callable[[], None] | None:
    """:func:`fbgemm_step` for tables given as ``name: (rows, features)``, the features in ``feature_ids``' order."""
    names = list(tables)
    table_of = {feature: names.index(name) for name, (_, features) in tables.items() for feature in features}
    features = list(feature_ids)
    return fbgemm_step(
        [rows for rows, _ in tables.values()],
        dim,
        [table_of[feature] for feature in features],
        [feature_ids[feature] for feature in features],
        [upstream[feature] for feature in features],
    )
