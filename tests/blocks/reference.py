"""Direct fp64 transcriptions of the papers' formulas, written from the weights alone (no lnblocks forward code):
the references the new block options are checked against."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def layer_norm(x: Tensor, w: Tensor | None, b: Tensor | None, eps: float) -> Tensor:
    mu = x.mean(-1, keepdim=True)
    y = (x - mu) / torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True) + eps)
    return y * (w if w is not None else 1) + (b if b is not None else 0)


def rms_norm(x: Tensor, w: Tensor | None, eps: float) -> Tensor:
    return x / torch.sqrt((x**2).mean(-1, keepdim=True) + eps) * (w if w is not None else 1)


def norm_of(module: torch.nn.Module | None):
    """The transcription of an lnblocks LayerNorm/RMSNorm module (its weights and eps), or the identity."""
    if module is None:
        return lambda x: x
    spec = module.spec
    w = getattr(module, "weight", None)
    if spec.kind == "layernorm":
        return lambda x: layer_norm(x, w, getattr(module, "bias", None), spec.eps)
    assert spec.kind == "rmsnorm" and spec.eps is not None, "references take layernorm or rmsnorm with an eps"
    return lambda x: rms_norm(x, w, spec.eps)


def l2(x: Tensor) -> Tensor:
    return x / torch.sqrt((x**2).sum(-1, keepdim=True))


def rotate(t: Tensor, rope: tuple[Tensor, Tensor] | None) -> Tensor:
    """RoPE in the rotate-half layout (GPT-NeoX, HF Llama): ``t cos + [-t2, t1] sin``."""
    if rope is None:
        return t
    cos, sin = rope
    half = t.shape[-1] // 2
    return t * cos + torch.cat((-t[..., half:], t[..., :half]), dim=-1) * sin


def attention(attn, x: Tensor, causal: bool = True, rope: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """Multi-head attention from ``attn``'s weights: the q/k(/v) norms per head, nGPT's L2 q/k times s_qk, the
    soft-cap ``c tanh(s / c)`` before the mask, the sigmoid output gate ``Y * sigmoid(x W_theta)`` after SDPA."""
    B, T, _ = x.shape
    H, hd = attn.n_heads, attn.head_dim
    wq, wk, wv = attn.split_qkv(attn.qkv.weight)
    bq, bk, bv = attn.split_qkv(attn.qkv.bias) if attn.qkv.bias is not None else (0, 0, 0)
    heads = lambda t: t.reshape(B, T, H, hd).transpose(1, 2)  # noqa: E731  (B, H, T, hd)
    q, k, v = heads(x @ wq.T + bq), heads(x @ wk.T + bk), heads(x @ wv.T + bv)
    q, k, v = norm_of(attn.q_norm)(q), norm_of(attn.k_norm)(k), norm_of(attn.v_norm)(v)
    q, k = rotate(q, rope), rotate(k, rope)
    scale = attn.config.scale if attn.config.scale is not None else hd**-0.5
    if attn.s_qk is not None:
        s = (attn.s_qk.weight * (attn.s_qk.init / attn.s_qk.scale)).unsqueeze(1)  # (H, 1, hd)
        q, k, scale = l2(q) * s, l2(k) * s, math.sqrt(hd)
    logits = q @ k.transpose(-1, -2) * scale  # (B, H, T, T)
    if attn.config.softcap is not None:
        c = attn.config.softcap
        logits = c * torch.tanh(logits / c)
    if causal:
        logits = logits.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    y = (torch.softmax(logits, -1) @ v).transpose(1, 2)  # (B, T, H, hd)
    if attn.gate_proj is not None:
        g = torch.sigmoid(x @ attn.gate_proj.weight.T + (attn.gate_proj.bias if attn.gate_proj.bias is not None else 0))
        y = y * g.reshape(B, T, H, -1)
    return y.reshape(B, T, H * hd) @ attn.proj.weight.T + (attn.proj.bias if attn.proj.bias is not None else 0)


def mlp(m, x: Tensor) -> Tensor:
    """``fc2(act(fc1 x))`` (GELU) or SwiGLU ``fc2(silu(gate) * up)``, with nGPT's s_u, s_v sqrt(d) (Eq. 20-21)."""
    h = x @ m.fc1.weight.T + (m.fc1.bias if m.fc1.bias is not None else 0)
    if m.config.activation == "gelu":
        return 0.5 * h * (1 + torch.erf(h / math.sqrt(2))) @ m.fc2.weight.T + m.fc2.bias
    assert m.config.activation == "swiglu"
    gate, up = h[..., : m.hidden_dim], h[..., m.hidden_dim :]
    if m.s_u is not None:
        up, gate = up * m.s_u.weight, gate * m.s_v.weight * math.sqrt(x.shape[-1])
    out = gate * torch.sigmoid(gate) * up @ m.fc2.weight.T
    return out + (m.fc2.bias if m.fc2.bias is not None else 0)
