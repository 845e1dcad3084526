"""Init schemes: the standard deviations each paper specifies, measured on the built model."""

from __future__ import annotations

import math

import pytest
import torch

from lnblocks import GPT, BlockConfig, GPTConfig
from lnblocks.blocks import deepnorm_alpha, deepnorm_beta

D, L = 128, 8


def build(init: str, placement: str = "pre", **block_options) -> GPT:
    block = BlockConfig(dim=D, placement=placement, attention={"n_heads": 4}, **block_options)
    return GPT(GPTConfig(vocab_size=512, max_seq_len=64, n_layers=L, block=block, init=init))


def std(t: torch.Tensor) -> float:
    return t.float().std().item()


def test_gpt2_init() -> None:
    """Radford et al. 2019 / nanoGPT: N(0, 0.02), residual projections N(0, 0.02 / sqrt(2L)), biases 0."""
    m = build("gpt2")
    for blk in m.blocks:
        assert std(blk.attn.qkv.weight) == pytest.approx(0.02, rel=0.05)
        assert std(blk.mlp.fc1.weight) == pytest.approx(0.02, rel=0.05)
        assert std(blk.attn.proj.weight) == pytest.approx(0.02 / math.sqrt(2 * L), rel=0.05)
        assert std(blk.mlp.fc2.weight) == pytest.approx(0.02 / math.sqrt(2 * L), rel=0.05)
        assert torch.all(blk.attn.qkv.bias == 0) and torch.all(blk.attn_in_norm.weight == 1)
    assert std(m.tok_emb.weight) == pytest.approx(0.02, rel=0.05)
    assert std(m.lm_head.weight) == pytest.approx(0.02, rel=0.05)


def test_gpt2_init_drops_depth_scaling_with_layernorm_scaling() -> None:
    """Sun et al. 2025: LayerNorm Scaling replaces the 1/sqrt(2L) init of the residual projections."""
    m = build("gpt2", depth_scaled_norm=True)
    assert std(m.blocks[5].mlp.fc2.weight) == pytest.approx(0.02, rel=0.05)
    assert m.blocks[3].in_scale == pytest.approx(0.5)


def test_xavier_init_per_logical_matrix_and_unit_embeddings() -> None:
    m = build("xavier", mlp={"activation": "swiglu", "hidden_dim": 256})
    glorot = math.sqrt(2 / (D + D))
    for role, w in m.blocks[0].matrices().items():
        fan_out, fan_in = w.shape
        assert std(w) == pytest.approx(math.sqrt(2 / (fan_in + fan_out)), rel=0.06), role
    assert std(m.blocks[0].matrices()["W_Q"]) == pytest.approx(glorot, rel=0.06)  # not over the fused qkv rows
    assert std(m.tok_emb.weight) == pytest.approx(1.0, rel=0.05)


def test_deepnet_init_scales_v_out_and_mlp_by_beta() -> None:
    """Wang et al. 2022, decoder-only: alpha = (2N)^(1/4); Xavier gain beta = (8N)^(-1/4) on W_V, W_O, W_1, W_2."""
    m = build("deepnet", placement="deepnorm")
    beta = (8 * L) ** -0.25
    assert deepnorm_beta(L) == pytest.approx(beta) and m.blocks[0].alpha == pytest.approx((2 * L) ** 0.25)
    assert deepnorm_alpha(L) == m.blocks[0].alpha
    mats = m.blocks[1].matrices()
    for role, gain in {"W_Q": 1.0, "W_K": 1.0, "W_V": beta, "W_O": beta, "W_1": beta, "W_2": beta}.items():
        fan_out, fan_in = mats[role].shape
        assert std(mats[role]) == pytest.approx(gain * math.sqrt(2 / (fan_in + fan_out)), rel=0.06), role


def test_norms_gates_and_overrides() -> None:
    m = build("xavier", norm={"kind": "rmsnorm", "zero_centered": True}, rezero=True)
    assert torch.all(m.blocks[0].attn_in_norm.weight == 0)  # zero-centred gain stored as w (applied 1 + w)
    assert m.blocks[0].attn_gate.item() == 0.0
    cfg = GPTConfig(n_layers=1, init="xavier", emb_init_std=0.5, tie_weights=True)
    m2 = GPT(cfg)
    assert std(m2.tok_emb.weight) == pytest.approx(0.5, rel=0.1)
