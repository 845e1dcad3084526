"""Attention against an fp64 per-head reference: GQA/MQA, causal or not, sliding window, QK-norm, RoPE, KV cache,
the three backends, and the eager backend's logit/entropy statistics."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from lnblocks.blocks import Attention, AttentionConfig, KVCache, apply_rope, rope_cache
from lnblocks.norms import norm_spec
from tests.blocks.block_helpers import randomize_

DIM = 32


def reference(attn: Attention, x: torch.Tensor, rope=None) -> torch.Tensor:
    """Loop over heads in fp64: softmax(q k^T * scale + mask) v, key head = query head // group size."""
    cfg, hd, H, Hkv = attn.config, attn.head_dim, attn.n_heads, attn.n_kv_heads
    x = x.double()
    w, b = attn.qkv.weight.double(), None if attn.qkv.bias is None else attn.qkv.bias.double()
    qkv = F.linear(x, w, b)
    q, k, v = qkv.split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
    B, T, _ = x.shape
    q, k, v = (t.view(B, T, -1, hd) for t in (q, k, v))
    if attn.q_norm is not None:
        q, k = copy.deepcopy(attn.q_norm).double()(q), copy.deepcopy(attn.k_norm).double()(k)
    outs = []
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    allowed = torch.ones(T, T, dtype=torch.bool)
    if cfg.causal:
        allowed &= j <= i
    if cfg.sliding_window is not None:
        allowed &= j > i - cfg.sliding_window
    for h in range(H):
        qh, kh, vh = q[:, :, h], k[:, :, h // (H // Hkv)], v[:, :, h // (H // Hkv)]
        if rope is not None:
            cos, sin = (t.double() for t in rope)
            qh, kh = apply_rope(qh, cos, sin), apply_rope(kh, cos, sin)
        logits = qh @ kh.transpose(-1, -2) * attn.scale
        logits = logits.masked_fill(~allowed, -math.inf)
        outs.append(torch.softmax(logits, -1) @ vh)
    y = torch.cat(outs, dim=-1)
    pw, pb = attn.proj.weight.double(), None if attn.proj.bias is None else attn.proj.bias.double()
    return F.linear(y, pw, pb)


CASES = {
    "mha_causal": {},
    "gqa": {"n_kv_heads": 2},
    "mqa": {"n_kv_heads": 1},
    "bidirectional": {"causal": False},
    "window": {"sliding_window": 3, "n_kv_heads": 2},
    "head_dim_16": {"head_dim": 16, "qkv_bias": False, "out_bias": False},
    "scale": {"scale": 0.5},
}


@pytest.mark.parametrize("backend", ["sdpa", "eager", "flash_attn"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("rope", [False, True])
def test_attention_matches_fp64_reference(case: str, backend: str, rope: bool) -> None:
    cfg = AttentionConfig(n_heads=4, backend=backend, **CASES[case])
    attn = randomize_(Attention(DIM, cfg)).eval()
    x = torch.randn(2, 9, DIM)
    cs = rope_cache(attn.head_dim, torch.arange(9)) if rope else None
    out = attn(x, cs)
    torch.testing.assert_close(out.double(), reference(attn, x, cs), rtol=1e-5, atol=2e-6)
    assert attn.last_backend == ("sdpa" if backend == "flash_attn" else backend)  # no flash-attn on CPU


@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm"])
def test_qk_norm_per_head_before_rope(kind: str) -> None:
    attn = randomize_(Attention(DIM, AttentionConfig(n_heads=4, n_kv_heads=2), qk_norm=norm_spec(kind))).eval()
    assert attn.q_norm.normalized_shape == (attn.head_dim,)
    x = torch.randn(2, 6, DIM)
    cs = rope_cache(attn.head_dim, torch.arange(6))
    torch.testing.assert_close(attn(x, cs).double(), reference(attn, x, cs), rtol=1e-5, atol=2e-6)


def test_rope_rotates_pairs_by_position_times_frequency() -> None:
    """RoPE as complex rotation (Su et al. 2021): pair (x_i, x_{i+d/2}) turns by pos * theta^(-2i/d)."""
    hd, T = 8, 5
    x = torch.randn(1, 1, T, hd, dtype=torch.float64)
    cos, sin = rope_cache(hd, torch.arange(T), theta=100.0, dtype=torch.float64)
    got = apply_rope(x, cos, sin)
    freqs = 100.0 ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * freqs  # (T, hd/2)
    z = torch.complex(x[..., : hd // 2], x[..., hd // 2 :]) * torch.polar(torch.ones_like(angle), angle)
    torch.testing.assert_close(got, torch.cat((z.real, z.imag), dim=-1), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="even head_dim"):
        rope_cache(7, torch.arange(3))


@pytest.mark.parametrize("case", ["mha_causal", "gqa", "window"])
@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_kv_cache_decoding_equals_full_forward(case: str, backend: str) -> None:
    attn = randomize_(Attention(DIM, AttentionConfig(n_heads=4, backend=backend, **CASES[case]))).eval()
    x = torch.randn(2, 10, DIM)
    cs = rope_cache(attn.head_dim, torch.arange(10))
    full = attn(x, cs)
    cache = KVCache(2, attn.n_kv_heads, 10, attn.head_dim, dtype=x.dtype, device=x.device)
    steps = [attn(x[:, :4], (cs[0][:4], cs[1][:4]), cache)]  # prefill 4, then one token at a time
    for t in range(4, 10):
        steps.append(attn(x[:, t : t + 1], (cs[0][t : t + 1], cs[1][t : t + 1]), cache))
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="KV cache holds 10 positions"):
        cache.update(
            torch.zeros(2, attn.n_kv_heads, 1, attn.head_dim), torch.zeros(2, attn.n_kv_heads, 1, attn.head_dim)
        )


def test_eager_stats_max_logit_and_entropy() -> None:
    attn = randomize_(Attention(DIM, AttentionConfig(n_heads=4, backend="eager"))).eval()
    x = torch.randn(3, 8, DIM)
    attn(x)
    q, k, _ = attn.qkv(x).split(DIM, dim=-1)
    q, k = (t.view(3, 8, 4, 8).transpose(1, 2).double() for t in (q, k))
    logits = (q @ k.transpose(-1, -2) * attn.scale).masked_fill(~torch.ones(8, 8, dtype=torch.bool).tril(), -math.inf)
    p = torch.softmax(logits, -1)
    ent = -(p * torch.where(p > 0, p.log(), torch.zeros_like(p))).sum(-1).mean(dim=(0, 2))
    stats = attn.last_stats
    torch.testing.assert_close(stats.max_logit.double(), logits.amax(dim=(0, 2, 3)), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(stats.entropy.double(), ent, rtol=1e-5, atol=1e-5)
    # uniform attention (zero queries): row i spreads over i + 1 keys, entropy log(i + 1)
    with torch.no_grad():
        attn.qkv.weight[:DIM].zero_()
        attn.qkv.bias.zero_()
    attn(x)
    expected = torch.log(torch.arange(1, 9, dtype=torch.float32)).mean()
    torch.testing.assert_close(attn.last_stats.entropy, expected.expand(4), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(attn.last_stats.max_logit, torch.zeros(4))


def test_sdpa_backend_records_no_stats_and_dropout_only_in_training() -> None:
    attn = Attention(DIM, AttentionConfig(n_heads=4, dropout=0.5))
    x = torch.randn(2, 6, DIM)
    attn.train()
    assert not torch.equal(attn(x), attn(x))
    attn.eval()
    assert torch.equal(attn(x), attn(x)) and attn.last_stats is None
    attn.config = dataclasses.replace(attn.config, backend="eager")  # switch backend on a built module
    attn(x)
    assert attn.last_backend == "eager" and attn.last_stats is not None
    attn.config = dataclasses.replace(attn.config, backend="sdpa")
    attn(x)
    assert attn.last_stats is None  # no stale statistics from an earlier eager call


def test_split_qkv_rows() -> None:
    attn = Attention(DIM, AttentionConfig(n_heads=4, n_kv_heads=2))
    q, k, v = attn.split_qkv(attn.qkv.weight)
    assert q.shape == (32, DIM) and k.shape == (16, DIM) and v.shape == (16, DIM)
    assert torch.equal(torch.cat([q, k, v]), attn.qkv.weight)
