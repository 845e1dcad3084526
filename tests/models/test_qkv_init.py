"""``GPTConfig.qkv_init``: per-matrix Xavier for W_Q/W_K/W_V (the default) or one Xavier draw over the stacked
in-projection, the variance ``torch.nn.MultiheadAttention`` gives its ``in_proj_weight``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lnblocks.blocks import BlockConfig
from lnblocks.models import GPT, GPTConfig


def gpt(dim: int, qkv_init: str, init: str = "xavier", layers: int = 2) -> GPT:
    torch.manual_seed(0)
    block = BlockConfig(dim=dim, attention={"n_heads": 4})
    return GPT(GPTConfig(vocab_size=32, max_seq_len=8, n_layers=layers, block=block, init=init, qkv_init=qkv_init))


def test_stacked_has_the_variance_of_multihead_attention_in_proj() -> None:
    d = 256
    w = torch.cat([b.attn.qkv.weight for b in gpt(d, "stacked", layers=4).blocks])  # (4 * 3d, d)
    mha = nn.MultiheadAttention(d, 4)  # xavier_uniform_ over the stacked (3d, d) in_proj_weight
    expected = 2.0 / (d + 3 * d)
    assert mha.in_proj_weight.var().item() == pytest.approx(expected, rel=0.03)
    assert w.var().item() == pytest.approx(expected, rel=0.03)
    per_matrix = torch.cat([b.attn.qkv.weight for b in gpt(d, "per_matrix", layers=4).blocks])
    assert per_matrix.var().item() == pytest.approx(2.0 / (d + d), rel=0.03)


def test_stacked_equals_per_matrix_scaled_by_sqrt_half_at_power_of_two_fan() -> None:
    """At d = 64 the two draws use the same random stream and std_stacked = std_per_matrix * 2^-0.5 exactly, so the
    stacked init equals the old trainer-side surgery (per-matrix Xavier, then W_QKV *= 2^-0.5) bit for bit."""
    a, b = gpt(64, "per_matrix"), gpt(64, "stacked")
    for blk_a, blk_b in zip(a.blocks, b.blocks):
        assert torch.equal(blk_a.attn.qkv.weight * 0.7071067811865476, blk_b.attn.qkv.weight)
        assert torch.equal(blk_a.mlp.fc1.weight, blk_b.mlp.fc1.weight)  # nothing else changes


def test_qkv_init_validation() -> None:
    with pytest.raises(ValueError, match=r"qkv_init must be one of \['per_matrix', 'stacked'\]"):
        GPTConfig(init="xavier", qkv_init="fused")
    with pytest.raises(ValueError, match="needs init='xavier' or 'deepnet'"):
        GPTConfig(init="gpt2", qkv_init="stacked")
