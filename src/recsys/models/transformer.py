"""Causal pre-norm transformer blocks as a sequence recommender runs them: the parameters of
``nn.TransformerEncoderLayer(norm_first=True, batch_first=True)`` (so checkpoints, ``state_dict`` names and the
tensor-parallel plans over ``linear1``/``linear2`` stay those of torch's layer), computed without three costs the
layer's own forward pays on every training step:

- its attention transposes the batch to ``[L, B, dim]`` and back around every projection; here the heads are views
  of ``[B, L, dim]``;
- ``nn.Dropout`` draws its mask with ``bernoulli_``, on a CPU about twice the time of drawing uniform numbers and
  comparing them with ``p`` (the same distribution: each value kept with probability ``1 - p``, scaled by
  ``1 / (1 - p)``);
- a model that reads one position of the last block's output (SASRec's query at a row's latest item) needs that
  block's keys and values at every position, but its attention and feed-forward layers at that position alone
  (``block_output_at``).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.functional import linear


def dropout(values: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """``values`` with each one zeroed with probability ``p`` and the others scaled by ``1 / (1 - p)`` in training,
    as ``nn.Dropout``; unchanged in evaluation."""
    if not training or p == 0.0:
        return values
    # In place on the uniform numbers: 1.0 where kept, then the scale; one tensor, one product forward and back.
    return values * torch.rand_like(values).ge_(p).mul_(1.0 / (1.0 - p))


def causal_block(block: nn.TransformerEncoderLayer, hidden: torch.Tensor) -> torch.Tensor:
    """``block``'s output at every position of ``hidden`` ``[B, L, dim]``, each position attending to itself and
    the ones before it: ``block(hidden, src_mask=<causal>, is_causal=True)``."""
    length = hidden.shape[1]
    later = torch.ones(length, length, dtype=torch.bool, device=hidden.device).triu(diagonal=1)
    normed = block.norm1(hidden)
    return _feed_forward(block, hidden + _dropout_of(block.dropout1, _attention(block, normed, normed, later)))


def block_output_at(block: nn.TransformerEncoderLayer, hidden: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """``causal_block(block, hidden)`` at each row's position ``last`` alone, ``[B, dim]``: that position attends to
    the ones up to it; no other position's attention or feed-forward layers are computed."""
    rows = torch.arange(last.shape[0], device=last.device)
    normed = block.norm1(hidden)
    later = torch.arange(hidden.shape[1], device=last.device) > last.unsqueeze(1)
    attended = _attention(block, normed[rows, last].unsqueeze(1), normed, later[:, None, None, :])
    return _feed_forward(block, hidden[rows, last] + _dropout_of(block.dropout1, attended.squeeze(1)))


def _attention(
    block: nn.TransformerEncoderLayer, queries: torch.Tensor, keys: torch.Tensor, hidden_keys: torch.Tensor
) -> torch.Tensor:
    """Multi-head attention of ``queries`` ``[B, Q, dim]`` over ``keys`` ``[B, L, dim]`` (which are the values
    too), with ``block.self_attn``'s projections; ``hidden_keys`` (broadcast to ``[B, heads, Q, L]``) is true where
    a query must not see a key."""
    attention = block.self_attn
    batch, num_queries, dim = queries.shape
    heads = attention.num_heads
    weight, bias = attention.in_proj_weight, attention.in_proj_bias
    biases = bias.split(dim) if bias is not None else (None, None, None)
    # The scale folded into the queries, a [B, Q, dim] tensor, rather than the [B, heads, Q, L] scores.
    scaled = linear(queries, weight[:dim], biases[0]) * (dim // heads) ** -0.5
    keys_and_values = linear(keys, weight[dim:], None if bias is None else bias[dim:])
    key_heads, value_heads = (_heads(part, heads) for part in keys_and_values.chunk(2, dim=-1))
    scores = _heads(scaled, heads) @ key_heads.transpose(-2, -1)
    weights = torch.softmax(scores.masked_fill_(hidden_keys, float("-inf")), dim=-1)
    weights = dropout(weights, attention.dropout, block.training)
    output: torch.Tensor = attention.out_proj((weights @ value_heads).transpose(1, 2).reshape(batch, num_queries, dim))
    return output


def _heads(values: torch.Tensor, heads: int) -> torch.Tensor:
    """``[B, L, dim]`` as ``[B, heads, L, dim / heads]`` (a view)."""
    batch, length, dim = values.shape
    return values.view(batch, length, heads, dim // heads).transpose(1, 2)


def _feed_forward(block: nn.TransformerEncoderLayer, hidden: torch.Tensor) -> torch.Tensor:
    """``hidden`` plus the block's feed-forward layers over its normed values."""
    inner = _dropout_of(block.dropout, block.activation(block.linear1(block.norm2(hidden))))
    output: torch.Tensor = hidden + _dropout_of(block.dropout2, block.linear2(inner))
    return output


def _dropout_of(module: nn.Module, values: torch.Tensor) -> torch.Tensor:
    """``values`` through ``dropout`` with the ``p`` and training mode of the layer's ``nn.Dropout`` ``module``."""
    assert isinstance(module, nn.Dropout)
    return dropout(values, module.p, module.training)
