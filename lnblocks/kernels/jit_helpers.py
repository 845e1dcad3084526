"""Device helpers shared by the fused norms' Triton kernels (``lnblocks.kernels.jit``): rounding as the GPU rounds,
the dropout keep-mask, tile loads, the effective weight, the HF cast orders, the gate's and the point-wise norms'
activations with their derivatives."""

from __future__ import annotations

import triton
import triton.language as tl

# Philox rounds for the dropout mask (flash-attn uses 7; Philox4x32-7 passes BigCrush, Salmon et al. 2011).
DROPOUT_ROUNDS: tl.constexpr = tl.constexpr(7)
TWO_OVER_SQRT_PI: tl.constexpr = tl.constexpr(1.1283791670955126)


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


@triton.jit
def tile(P, rows, cols, stride, mask):
    """A (rows, cols) tile of a row-major operand, fp32 (zeros outside ``mask``)."""
    return tl.load(P + rows[:, None] * stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)


# fmt: off
@triton.jit
def load_z(X, R, SEED, rows, cols, mask, stride_xm, stride_rm, N, dropout_p, dropout_scale,
           HAS_RES: tl.constexpr, HAS_DROPOUT: tl.constexpr, Z_DTYPE: tl.constexpr, RNE: tl.constexpr):
# fmt: on
    """The norm's input, fp32: ``dropout(x) + residual`` rounded to the residual stream's dtype (what eager sees)."""
    z = tile(X, rows, cols, stride_xm, mask)
    if HAS_DROPOUT:
        z = tl.where(keep_mask(SEED, rows, cols, N, dropout_p), z * dropout_scale, 0.0)
    if HAS_RES:
        z += tile(R, rows, cols, stride_rm, mask)
        z = round_to(z, Z_DTYPE, RNE).to(tl.float32)
    return z


@triton.jit
def load_weight(W, cols, N, ZERO_CENTERED: tl.constexpr, W_DTYPE: tl.constexpr, RNE: tl.constexpr):
    """The effective weight in fp32: ``1 + w`` with the ``+ 1`` in fp32 when zero-centred (Liger#1462), or added
    in fp32 and rounded to the weight's dtype (``ZERO_CENTERED == 2``: ``NemotronLayerNorm1P``'s ``weight + 1``)."""
    w = tl.load(W + cols, mask=cols < N, other=0.0).to(tl.float32)
    if ZERO_CENTERED:
        w += 1.0
    if ZERO_CENTERED == 2:
        w = round_to(w, W_DTYPE, RNE).to(tl.float32)
    return w


@triton.jit
def round_hat(h, ROUND_MODE: tl.constexpr, Z_DTYPE: tl.constexpr, W_DTYPE: tl.constexpr, RNE: tl.constexpr):
    """HF cast orders: 1 = round x_hat to the input dtype before the weight (Llama), 2 = to the weight dtype (T5)."""
    if ROUND_MODE == 1:
        h = round_to(h, Z_DTYPE, RNE).to(tl.float32)
    elif ROUND_MODE == 2:
        h = round_to(h, W_DTYPE, RNE).to(tl.float32)
    return h


@triton.jit
def gate_act(g, GATE_ACT: tl.constexpr):
    """``(act(g), act'(g))`` of the gate, fp32: 0 = silu (``g * sigmoid(g)``), 1 = sigmoid."""
    s = tl.sigmoid(g)
    if GATE_ACT == 0:
        return g * s, s * (1.0 + g * (1.0 - s))
    return s, s * (1.0 - s)


@triton.jit
def pointwise_act(u, POINTWISE: tl.constexpr):
    """``(f(u), f'(u))`` of the point-wise norms: 1 = tanh (DyT), 2 = erf (Derf)."""
    if POINTWISE == 1:
        e = tl.exp(-2.0 * tl.abs(u))  # tanh from exp (no libdevice: the interpreter has none), no overflow
        t = (1.0 - e) / (1.0 + e)
        t = tl.where(u < 0, -t, t)
        return t, 1.0 - t * t
    return tl.math.erf(u), TWO_OVER_SQRT_PI * tl.exp(-u * u)


@triton.jit
def load_scalar(P):
    return tl.load(P).to(tl.float32)
