"""``recsys.models.transformer``: torch's pre-norm layer's parameters run without its transposes, with a faster
dropout of the same distribution, and at one position where a model reads one."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from recsys.models.transformer import block_output_at, causal_block, dropout

LENGTH, DIM = 7, 8


def layer(heads: int, p: float = 0.0) -> nn.TransformerEncoderLayer:
    torch.manual_seed(0)
    block = nn.TransformerEncoderLayer(DIM, heads, 2 * DIM, p, batch_first=True, norm_first=True)
    for parameter in block.parameters():  # torch's init leaves the biases at zero, which would hide a wrong one.
        nn.init.uniform_(parameter, -0.5, 0.5)
    return block


def causal(block: nn.TransformerEncoderLayer, hidden: torch.Tensor) -> torch.Tensor:
    mask = torch.triu(torch.ones(LENGTH, LENGTH, dtype=torch.bool), diagonal=1)
    output: torch.Tensor = block(hidden, src_mask=mask, is_causal=True)
    return output


@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize("training", [False, True])
def test_a_causal_block_gives_torchs_layer_output_and_gradients(heads: int, training: bool) -> None:
    block = layer(heads).train(training)  # No dropout, so that training mode is comparable.
    hidden = torch.randn(5, LENGTH, DIM, requires_grad=True)
    ours, theirs = causal_block(block, hidden), causal(block, hidden)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)

    weights = torch.randn_like(ours)
    ours_grads = torch.autograd.grad((ours * weights).sum(), [hidden, *block.parameters()])
    theirs_grads = torch.autograd.grad((theirs * weights).sum(), [hidden, *block.parameters()])
    for mine, torchs in zip(ours_grads, theirs_grads, strict=True):
        torch.testing.assert_close(mine, torchs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("heads", [1, 2])
def test_the_output_at_one_position_is_the_full_blocks_there_whatever_comes_after(heads: int) -> None:
    block = layer(heads).eval()
    hidden = torch.randn(6, LENGTH, DIM)
    last = torch.tensor([0, 1, 3, 6, 6, 2])
    full = causal(block, hidden)[torch.arange(6), last]
    torch.testing.assert_close(block_output_at(block, hidden, last), full, rtol=1e-5, atol=1e-5)

    later = torch.arange(LENGTH) > last.unsqueeze(1)
    changed = hidden.masked_fill(later.unsqueeze(-1), 100.0)  # Positions after `last` are never attended.
    torch.testing.assert_close(block_output_at(block, changed, last), full, rtol=1e-5, atol=1e-5)


def test_dropout_keeps_each_value_with_probability_one_minus_p_and_scales_the_kept() -> None:
    torch.manual_seed(0)
    values = torch.rand(200_000) + 1.0
    values.requires_grad_(True)
    dropped = dropout(values, 0.25, training=True)
    kept = dropped != 0
    assert abs(kept.float().mean().item() - 0.75) < 0.005  # 200,000 draws: the standard error is 0.001.
    torch.testing.assert_close(dropped[kept], values[kept] / 0.75)
    (grad,) = torch.autograd.grad(dropped.sum(), values)
    torch.testing.assert_close(grad, kept.float() / 0.75)


def test_dropout_draws_from_torchs_generator_so_a_seed_repeats_it() -> None:
    values = torch.ones(1000)
    torch.manual_seed(3)
    first = dropout(values, 0.5, training=True)
    torch.manual_seed(3)
    torch.testing.assert_close(dropout(values, 0.5, training=True), first)


def test_dropout_leaves_values_unchanged_in_evaluation_or_at_zero() -> None:
    values = torch.randn(10)
    assert dropout(values, 0.5, training=False) is values
    assert dropout(values, 0.0, training=True) is values


def test_a_block_drops_in_training_only() -> None:
    """In training, two passes of one block draw their dropouts apart; in evaluation they are one."""
    block = layer(1, p=0.5).train()
    hidden = torch.randn(4, LENGTH, DIM)
    first, second = causal_block(block, hidden), causal_block(block, hidden)
    assert not torch.equal(first, second)
    block.eval()
    assert torch.equal(causal_block(block, hidden), causal_block(block, hidden))
