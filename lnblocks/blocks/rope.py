"""Rotary position embedding (RoPE, Su et al. 2021) in the rotate-half layout of GPT-NeoX and HF Llama.

Computed op for op like ``LlamaRotaryEmbedding`` / ``apply_rotary_pos_emb`` (fp32 angles, cast to the model dtype),
so converted Llama/Mistral/Qwen weights give the same logits. The model computes ``(cos, sin)`` once per forward and
passes it to every block; a block never owns positions.
"""

from __future__ import annotations

import torch
from torch import Tensor


def rope_cache(
    head_dim: int, positions: Tensor, theta: float = 10000.0, dtype: torch.dtype = torch.float32
) -> tuple[Tensor, Tensor]:
    """``(cos, sin)``, each ``(T, head_dim)``, for integer ``positions`` of shape ``(T,)``."""
    if head_dim % 2 != 0:
        raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
    idx = torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions.device).float()
    inv_freq = 1.0 / (theta ** (idx / head_dim))  # (hd/2,)
    freqs = positions[:, None].float() * inv_freq[None, :]  # (T, hd/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (T, hd)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate ``x`` of shape ``(B, H, T, hd)`` by the angles of ``cos``/``sin`` of shape ``(T, hd)``."""
    return (x * cos) + (rotate_half(x) * sin)
