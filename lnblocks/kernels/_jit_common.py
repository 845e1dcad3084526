"""Triton helpers shared by the forward, backward and dropout kernels: rounding, dropout mask, the affine step."""

from __future__ import annotations

import triton
import triton.language as tl

# Philox rounds for the dropout mask (flash-attn uses 7; Philox4x32-7 passes BigCrush, Salmon et al. 2011).
DROPOUT_ROUNDS: tl.constexpr = tl.constexpr(7)


@triton.jit
def round_to(v, dtype: tl.constexpr, RNE: tl.constexpr):
    """``v.to(dtype)`` with round-to-nearest-even.

    GPUs convert fp32 -> bf16 with RNE (``cvt.rn``); Triton's CPU interpreter truncates, so under the interpreter
    (``RNE=True``) the rounding is done on the bits. fp16 and fp32 targets are exact RNE either way.
    """
    if RNE and dtype == tl.bfloat16:
        bits = v.to(tl.float32).to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        r = bits.to(tl.float32, bitcast=True)
        r = tl.where(v == v, r, v)  # keep NaN a NaN (the carry above could turn it into 0 or inf)
        return r.to(dtype)
    return v.to(dtype)


@triton.jit
def keep_mask(SEED, rows, cols, N, p):
    """Dropout keep-mask of a (rows, cols) tile: Philox keyed by the seed, counter = row * N + col (64-bit).

    Each row owns its own counter range, so the mask is a pure function of (seed, row, col): the backward
    recomputes it instead of storing it (flash-attn's per-row seeds; 0 extra bytes per element).
    """
    seed = tl.load(SEED)
    offsets = rows[:, None] * N + cols[None, :]  # int64: no overflow above 2^31 elements
    return tl.rand(seed, offsets, n_rounds=DROPOUT_ROUNDS) >= p


# fmt: off
@triton.jit
def load_z(X, R, SEED, rows, cols, mask, stride_xm, stride_rm, N, dropout_p, dropout_scale,
           HAS_RES: tl.constexpr, HAS_DROPOUT: tl.constexpr, Z_DTYPE: tl.constexpr, RNE: tl.constexpr):
# fmt: on
    """The norm's input, fp32: ``dropout(x) + residual`` rounded to the residual stream's dtype (what eager sees)."""
    z = tl.load(X + rows[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_DROPOUT:
        z = tl.where(keep_mask(SEED, rows, cols, N, dropout_p), z * dropout_scale, 0.0)
    if HAS_RES:
        z += tl.load(R + rows[:, None] * stride_rm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        z = round_to(z, Z_DTYPE, RNE).to(tl.float32)
    return z


@triton.jit
def load_weight(W, cols, N, ZERO_CENTERED: tl.constexpr):
    """The effective weight in fp32: ``1 + w`` with the ``+ 1`` in fp32 when zero-centred (Liger#1462)."""
    w = tl.load(W + cols, mask=cols < N, other=0.0).to(tl.float32)
    if ZERO_CENTERED:
        w += 1.0
    return w


@triton.jit
def round_hat(h, ROUND_MODE: tl.constexpr, Z_DTYPE: tl.constexpr, W_DTYPE: tl.constexpr, RNE: tl.constexpr):
    """HF cast orders: 1 = round x_hat to the input dtype before the weight (Llama), 2 = to the weight dtype (T5)."""
    if ROUND_MODE == 1:
        h = round_to(h, Z_DTYPE, RNE).to(tl.float32)
    elif ROUND_MODE == 2:
        h = round_to(h, W_DTYPE, RNE).to(tl.float32)
    return h
