"""Multi-head self-attention with grouped KV heads, optional per-head QK-norm, RoPE and three backends.

One fused ``qkv`` projection (rows ``[q; k; v]``, split with ``Attention.split_qkv``) and one output ``proj``.
Backends: ``"sdpa"`` (``F.scaled_dot_product_attention``), ``"flash_attn"`` (imported lazily; CUDA, fp16/bf16,
falls back to sdpa otherwise) and ``"eager"`` (explicit fp32 softmax that records, per head, the largest attention
logit and the mean attention entropy: the stability diagnostics of Wortsman et al. 2023 and Zhai et al. 2023).
``last_backend`` says which backend the latest call ran; the backend is read from ``attn.config`` at every call, so
swapping ``attn.config`` (e.g. ``dataclasses.replace(cfg, backend="eager")``) switches it on a built model.

Options beyond plain attention, each off by default (the default path is unchanged): a per-head norm of v besides
q and k (HybridNorm's QKV-norm, Zhuo et al. 2025, arXiv 2503.04598); attention-logit soft-capping
``cap * tanh(logits / cap)`` before the mask and softmax (Gemma 2, arXiv 2408.00118; sdpa cannot cap, so a capped
layer runs the eager path, or flash-attn's own ``softcap``); the sigmoid output gate ``Y * sigmoid(X W_theta)`` on
the SDPA output before ``proj``, one gate per head or per element, ``X`` the attention's input (gated attention,
Qiu et al. 2025, arXiv 2505.06708, position G1); and nGPT's attention (``normalized``: q and k L2-normalised after
RoPE and scaled by ``s_qk``, softmax scale ``sqrt(head_dim)``; Loshchilov et al. 2024, arXiv 2410.01131, Eq. 15-16).
"""

from __future__ import annotations

import importlib.util
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lnblocks.blocks.config import AttentionConfig
from lnblocks.blocks.ngpt import Scale, l2_normalize
from lnblocks.blocks.rope import apply_rope
from lnblocks.norms import NormSpec, build_norm


def softcap(x: Tensor, cap: float) -> Tensor:
    """``cap * tanh(x / cap)``: Gemma 2's logit soft-capping (arXiv 2408.00118), as ``transformers`` computes it."""
    return torch.tanh(x / cap) * cap


class AttentionStats(NamedTuple):
    """Per-head statistics of the latest eager call (detached, fp32).

    ``max_logit``: ``(H,)`` largest scaled logit ``q.k * scale`` over allowed (unmasked) pairs.
    ``entropy``: ``(H,)`` mean over batch and queries of ``-sum_j p_ij log p_ij`` (nats).
    ``first_token_mass``: ``(H,)`` mean attention probability on key 0 (the attention sink, Xiao et al. 2023), over
    the batch and the queries that see other keys too (with a causal mask: every query but the one at position 0).
    """

    max_logit: Tensor
    entropy: Tensor
    first_token_mass: Tensor | None = None


class KVCache:
    """Pre-allocated keys and values of one attention layer for incremental decoding (``GPT.generate``)."""

    def __init__(
        self, batch: int, n_kv_heads: int, max_len: int, head_dim: int, *, dtype: torch.dtype, device: torch.device
    ) -> None:
        shape = (batch, n_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append ``k``, ``v`` of shape ``(B, Hkv, T, hd)``; return all keys and values so far."""
        end = self.length + k.shape[2]
        if end > self.k.shape[2]:
            raise ValueError(f"KV cache holds {self.k.shape[2]} positions; appending would need {end}")
        self.k[:, :, self.length : end] = k
        self.v[:, :, self.length : end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """``(B, Hkv, T, hd)`` -> ``(B, Hkv * n_rep, T, hd)``, each KV head serving ``n_rep`` query heads."""
    if n_rep == 1:
        return x
    b, h, t, d = x.shape
    return x[:, :, None].expand(b, h, n_rep, t, d).reshape(b, h * n_rep, t, d)


def flash_attn_unavailable_reason(q: Tensor) -> str | None:
    """Why the flash-attn backend cannot run on ``q``, or None when it can."""
    if not q.is_cuda:
        return f"q is on {q.device.type}; flash-attn runs on CUDA"
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"flash-attn needs float16/bfloat16, got {q.dtype}"
    if importlib.util.find_spec("flash_attn") is None:
        return "flash-attn is not installed (pip install 'lnblocks[gpu]')"
    return None


class Attention(nn.Module):
    """Self-attention of ``dim`` channels. Parameters: ``qkv`` (Linear dim -> (H + 2 Hkv) hd), ``proj``
    (Linear H hd -> dim), ``q_norm``/``k_norm`` (per head, over hd) when ``qk_norm`` is given, ``v_norm`` likewise
    with ``v_norm``, ``gate_proj`` (Linear dim -> H, or H hd element-wise) with ``config.output_gate``, and nGPT's
    ``s_qk`` (a ``Scale`` of shape (H, hd)) when ``normalized``.
    """

    def __init__(
        self,
        dim: int,
        config: AttentionConfig,
        qk_norm: NormSpec | None = None,
        v_norm: NormSpec | None = None,
        normalized: bool = False,
    ) -> None:
        super().__init__()
        self.config = config
        self.n_heads = config.n_heads
        self.n_kv_heads = config.kv_heads
        self.head_dim = config.head_dim or dim // config.n_heads
        self.scale = config.scale if config.scale is not None else self.head_dim**-0.5
        q_rows, kv_rows = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        self.qkv = nn.Linear(dim, q_rows + 2 * kv_rows, bias=config.qkv_bias)
        self.proj = nn.Linear(q_rows, dim, bias=config.out_bias)
        self.q_norm = build_norm(qk_norm, self.head_dim) if qk_norm is not None else None
        self.k_norm = build_norm(qk_norm, self.head_dim) if qk_norm is not None else None
        self.v_norm = build_norm(v_norm, self.head_dim) if v_norm is not None else None
        if config.output_gate is not None:
            gate_rows = self.n_heads * (self.head_dim if config.output_gate == "elementwise" else 1)
            self.gate_proj = nn.Linear(dim, gate_rows, bias=config.qkv_bias)
        else:
            self.gate_proj = None
        if normalized:  # nGPT: s_qk starts at 1 and learns at the rate of 1/sqrt(d_model) (its Sec. 2.5)
            self.s_qk = Scale((self.n_heads, self.head_dim), init=1.0, scale=dim**-0.5)
            self.scale = self.head_dim**0.5
        else:
            self.s_qk = None
        self.attn_dropout = config.dropout
        self.last_backend: str | None = None
        self.last_stats: AttentionStats | None = None

    # ---- weights by role ------------------------------------------------------------------------------------
    def qkv_slices(self) -> dict[str, slice]:
        """Row slices of ``qkv.weight`` (and of its ``.grad``) holding W_Q, W_K and W_V."""
        q, kv = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        return {"q": slice(0, q), "k": slice(q, q + kv), "v": slice(q + kv, q + 2 * kv)}

    def split_qkv(self, t: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Split a tensor shaped like ``qkv.weight`` or ``qkv.bias`` (or their grads) into its q, k, v rows."""
        s = self.qkv_slices()
        return t[s["q"]], t[s["k"]], t[s["v"]]

    def local_heads(self, width: int) -> tuple[int, int]:
        """``(query heads, KV heads)`` of a ``qkv`` output ``width`` wide: all of them, or under tensor parallelism
        (``lnblocks.models.parallel``) a rank's equal share, each rank holding whole heads of q, k and v."""
        full = (self.n_heads + 2 * self.n_kv_heads) * self.head_dim
        shards = full // width if 0 < width <= full else 0
        if shards == 0 or shards * width != full or self.n_heads % shards or self.n_kv_heads % shards:
            raise ValueError(
                f"qkv output width {width} is not the full width {full} nor an equal share of whole heads "
                f"(n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, head_dim={self.head_dim})"
            )
        return self.n_heads // shards, self.n_kv_heads // shards

    # ---- backend choice -------------------------------------------------------------------------------------
    def backend_for(self, q: Tensor) -> str:
        """The backend a call with queries ``q`` runs: ``"sdpa"``, ``"flash_attn"`` or ``"eager"`` (soft-capped
        logits: flash-attn where it runs, else eager, as sdpa cannot cap)."""
        backend = self.config.backend
        if backend == "flash_attn":
            backend = "flash_attn" if flash_attn_unavailable_reason(q) is None else "sdpa"
        if backend == "sdpa" and self.config.softcap is not None:
            return "eager"
        return backend

    def _window(self, tk: int) -> int | None:
        """The sliding window if it hides any of ``tk`` keys, else None (a window >= tk changes nothing)."""
        w = self.config.sliding_window
        return w if w is not None and tk > w else None

    def _mask(self, tq: int, tk: int, device: torch.device) -> Tensor:
        """Boolean ``(tq, tk)``: True where query i (at position tk - tq + i) may attend to key j."""
        qpos = torch.arange(tk - tq, tk, device=device)[:, None]
        kpos = torch.arange(tk, device=device)[None, :]
        allowed = kpos <= qpos
        window = self._window(tk)
        if window is not None:
            allowed = allowed & (kpos > qpos - window)
        return allowed

    # ---- forward --------------------------------------------------------------------------------------------
    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor] | None = None, cache: KVCache | None = None) -> Tensor:
        if not isinstance(x, Tensor) or x.dim() != 3 or x.shape[-1] != self.qkv.in_features:
            got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"x must be a tensor of shape (B, T, C) with C = dim = {self.qkv.in_features}, got {got}")
        B, T, _ = x.shape  # (B, T, C)
        hd = self.head_dim
        qkv = self.qkv(x)  # (B, T, (H + 2 Hkv) hd), or one tensor-parallel rank's share of the heads
        h, hkv = self.local_heads(qkv.shape[-1])
        q, k, v = qkv.split([h * hd, hkv * hd, hkv * hd], dim=-1)
        q = q.view(B, T, h, hd).transpose(1, 2)  # (B, H, T, hd)
        k = k.view(B, T, hkv, hd).transpose(1, 2)  # (B, Hkv, T, hd)
        v = v.view(B, T, hkv, hd).transpose(1, 2)  # (B, Hkv, T, hd)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)  # per head, before RoPE (Qwen3)
        if self.v_norm is not None:
            v = self.v_norm(v)  # per head (HybridNorm's QKV-norm)
        if rope is not None:
            cos, sin = rope
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.s_qk is not None:  # nGPT Eq. 15-16: after RoPE, unit norm times s_qk
            if h != self.n_heads:
                raise ValueError("nGPT attention (placement 'ngpt') does not run on a tensor-parallel share of heads")
            s_qk = self.s_qk().to(q.dtype).unsqueeze(1)  # (H, 1, hd)
            q, k = l2_normalize(q) * s_qk, l2_normalize(k) * s_qk
        if (rope is not None or self.q_norm is not None) and v.requires_grad:
            # q and k are new tensors now; v, a view of qkv's output, would keep all of that output alive as a
            # saved tensor of the attention backward: save a copy of v alone (as separate q/k/v projections do)
            v = v.contiguous()
        if cache is not None:
            k, v = cache.update(k, v)  # (B, Hkv, Tk, hd)
        backend = self.backend_for(q)
        if not torch.compiler.is_compiling():
            self.last_backend = backend
            if backend != "eager":
                self.last_stats = None  # stats always describe the latest call (only eager records them)
        if backend == "flash_attn":
            y = self._flash(q, k, v)
        elif backend == "sdpa":
            y = self._sdpa(q, k, v)  # GQA inside sdpa: K/V are kept (and saved for backward) at Hkv heads
        else:
            rep = h // hkv
            y = self._eager(q, repeat_kv(k, rep), repeat_kv(v, rep))  # (B, H, Tk, hd)
        y = y.transpose(1, 2)  # (B, T, H, hd)
        if self.gate_proj is not None:
            y = y * self._gate(x, h)  # gated attention: Y * sigmoid(X W_theta), per head or per element
        return self.proj(y.reshape(B, T, h * hd))  # (B, T, H*hd) -> (B, T, C)

    def _gate(self, x: Tensor, h: int) -> Tensor:
        """``sigmoid(x W_theta)`` shaped ``(B, T, H, 1)`` (head-wise) or ``(B, T, H, hd)`` (element-wise)."""
        g = torch.sigmoid(self.gate_proj(x))  # (B, T, H) or (B, T, H hd)
        per_head = 1 if self.config.output_gate == "headwise" else self.head_dim
        if g.shape[-1] != h * per_head:
            raise ValueError("the attention output gate does not run on a tensor-parallel share of heads")
        return g.unflatten(-1, (h, per_head))

    def _sdpa(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """``q`` ``(B, H, Tq, hd)``, ``k``/``v`` ``(B, Hkv, Tk, hd)``: grouped heads via ``enable_gqa``, as HF does,
        so no repeated copy of K and V is made or saved for backward."""
        tq, tk = q.shape[2], k.shape[2]
        opts = {"dropout_p": self.attn_dropout if self.training else 0.0, "scale": self.scale}
        if self.n_kv_heads != self.n_heads:
            opts["enable_gqa"] = True
        simple_causal = self.config.causal and self._window(tk) is None
        if not self.config.causal or (simple_causal and tq == 1):
            return F.scaled_dot_product_attention(q, k, v, **opts)
        if simple_causal and tq == tk:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, **opts)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self._mask(tq, tk, q.device), **opts)

    def _eager(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        att = torch.matmul(q, k.transpose(-2, -1)) * self.scale  # (B, H, Tq, Tk)
        if self.config.softcap is not None:
            att = softcap(att, self.config.softcap)  # before the mask, as Gemma 2
        if self.config.causal:
            att = att.masked_fill(~self._mask(q.shape[2], k.shape[2], q.device), float("-inf"))
        probs = torch.softmax(att, dim=-1, dtype=torch.promote_types(q.dtype, torch.float32)).to(q.dtype)
        if not torch.compiler.is_compiling():
            self.last_stats = self._stats(att, probs)
        probs = F.dropout(probs, p=self.attn_dropout, training=self.training)
        return torch.matmul(probs, v)  # (B, H, Tq, hd)

    @torch.no_grad()
    def _stats(self, att: Tensor, probs: Tensor) -> AttentionStats:
        p = probs.detach().float()  # (B, H, Tq, Tk)
        tq, tk = p.shape[2], p.shape[3]
        sink = p[..., 0]  # (B, H, Tq): the probability on key 0
        if self.config.causal:  # the query at position 0 sees key 0 alone
            sink = sink[:, :, max(0, 1 - (tk - tq)) :]
        return AttentionStats(
            max_logit=att.detach().float().amax(dim=(0, 2, 3)),
            entropy=torch.special.entr(p).sum(-1).mean(dim=(0, 2)),
            first_token_mass=sink.mean(dim=(0, 2)) if sink.numel() else torch.ones(p.shape[1], device=p.device),
        )

    def _flash(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:  # pragma: no cover - needs CUDA + flash-attn
        from flash_attn import flash_attn_func

        window = self.config.sliding_window
        y = flash_attn_func(
            q.transpose(1, 2),  # flash-attn layout (B, T, H, hd); GQA handled natively
            k.transpose(1, 2),
            v.transpose(1, 2),
            dropout_p=self.attn_dropout if self.training else 0.0,
            softmax_scale=self.scale,
            causal=self.config.causal,
            window_size=(window - 1, 0) if window is not None else (-1, -1),
            deterministic=torch.are_deterministic_algorithms_enabled(),  # its dq backward otherwise uses atomics
            **({"softcap": self.config.softcap} if self.config.softcap is not None else {}),
        )
        return y.transpose(1, 2)  # (B, H, Tq, hd)
