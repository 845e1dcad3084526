"""Forward kernel of LayerNorm and RMSNorm, with the residual add and dropout fused in, and its launcher.

One pass over memory: read x (and the residual), write y (and the new residual), plus fp32 mean/rstd per row
for the backward. Rows that fit in registers are normalised from registers (flash-attn's layout, several rows per
program when N is small); wider rows loop over chunks with a per-lane Welford/Chan merge for stable statistics.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from lnblocks.kernels._jit_common import load_weight, load_z, round_hat, round_to
from lnblocks.kernels.heuristics import fwd_config
from lnblocks.kernels.launch import empty, interpreter_rne, row_stride, tl_dtype
from lnblocks.kernels.plan import NormPlan


# fmt: off
@triton.jit
def _normalize_store(z, mean, rstd, W, B, Y, rows, cols, mask, stride_ym, N,
                     IS_RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, ZERO_CENTERED: tl.constexpr,
                     ROUND_MODE: tl.constexpr, Z_DTYPE: tl.constexpr, W_DTYPE: tl.constexpr, Y_DTYPE: tl.constexpr,
                     RNE: tl.constexpr):
# fmt: on
    h = z * rstd[:, None] if IS_RMS else (z - mean[:, None]) * rstd[:, None]
    h = round_hat(h, ROUND_MODE, Z_DTYPE, W_DTYPE, RNE)
    if HAS_W:
        h = h * load_weight(W, cols, N, ZERO_CENTERED)[None, :]
    if HAS_B:
        h += tl.load(B + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    tl.store(Y + rows[:, None] * stride_ym + cols[None, :], round_to(h, Y_DTYPE, RNE), mask=mask)


# fmt: off
@triton.jit
def _norm_fwd_kernel(
    X, R, W, B, SEED, Y, RES, MEAN, RSTD,
    stride_xm, stride_rm, stride_ym, stride_resm,
    M, N, eps, dropout_p, dropout_scale,
    IS_RMS: tl.constexpr, HAS_RES: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
    ZERO_CENTERED: tl.constexpr, HAS_DROPOUT: tl.constexpr, ROUND_MODE: tl.constexpr,
    Z_DTYPE: tl.constexpr, W_DTYPE: tl.constexpr, Y_DTYPE: tl.constexpr, RNE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SINGLE_BLOCK: tl.constexpr,
):
# fmt: on
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # (BM,) int64 row offsets
    row_mask = rows < M
    if SINGLE_BLOCK:
        cols = tl.arange(0, BLOCK_N)
        mask = row_mask[:, None] & (cols < N)[None, :]
        z = load_z(X, R, SEED, rows, cols, mask, stride_xm, stride_rm, N, dropout_p, dropout_scale,
                   HAS_RES, HAS_DROPOUT, Z_DTYPE, RNE)  # (BM, BN) fp32
        if HAS_RES:
            tl.store(RES + rows[:, None] * stride_resm + cols[None, :], z, mask=mask)  # already rounded
        if IS_RMS:
            mean = tl.zeros((BLOCK_M,), tl.float32)
            var = tl.sum(z * z, axis=1) / N
        else:
            mean = tl.sum(z, axis=1) / N
            zc = tl.where(mask, z - mean[:, None], 0.0)
            var = tl.sum(zc * zc, axis=1) / N
    else:
        # Pass 1: statistics over chunks. Each lane keeps a Welford mean/M2 of the elements it saw; lanes are merged
        # with Chan's formula, so a large common offset does not cancel catastrophically as E[x^2] - E[x]^2 would.
        lane_mean = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        lane_m2 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        lane_n = tl.zeros((BLOCK_N,), tl.float32)
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            col_mask = cols < N
            mask = row_mask[:, None] & col_mask[None, :]
            z = load_z(X, R, SEED, rows, cols, mask, stride_xm, stride_rm, N, dropout_p, dropout_scale,
                       HAS_RES, HAS_DROPOUT, Z_DTYPE, RNE)
            if HAS_RES:
                tl.store(RES + rows[:, None] * stride_resm + cols[None, :], z, mask=mask)
            if IS_RMS:
                lane_m2 += z * z
            else:
                lane_n += col_mask.to(tl.float32)
                delta = tl.where(col_mask[None, :], z - lane_mean, 0.0)
                lane_mean += delta / tl.maximum(lane_n, 1.0)[None, :]
                lane_m2 += delta * (z - lane_mean)
        if IS_RMS:
            mean = tl.zeros((BLOCK_M,), tl.float32)
            var = tl.sum(lane_m2, axis=1) / N
        else:
            mean = tl.sum(lane_mean * lane_n[None, :], axis=1) / N
            d = lane_mean - mean[:, None]
            var = tl.sum(lane_m2 + lane_n[None, :] * d * d, axis=1) / N
    rstd = tl.rsqrt(var + eps)
    if not IS_RMS:
        tl.store(MEAN + rows, mean, mask=row_mask)
    tl.store(RSTD + rows, rstd, mask=row_mask)
    if SINGLE_BLOCK:
        _normalize_store(z, mean, rstd, W, B, Y, rows, cols, mask, stride_ym, N, IS_RMS, HAS_W, HAS_B,
                         ZERO_CENTERED, ROUND_MODE, Z_DTYPE, W_DTYPE, Y_DTYPE, RNE)
    else:
        # Pass 2: recompute z from the inputs (not from RES: another thread of this program may have written it).
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = row_mask[:, None] & (cols < N)[None, :]
            z = load_z(X, R, SEED, rows, cols, mask, stride_xm, stride_rm, N, dropout_p, dropout_scale,
                       HAS_RES, HAS_DROPOUT, Z_DTYPE, RNE)
            _normalize_store(z, mean, rstd, W, B, Y, rows, cols, mask, stride_ym, N, IS_RMS, HAS_W, HAS_B,
                             ZERO_CENTERED, ROUND_MODE, Z_DTYPE, W_DTYPE, Y_DTYPE, RNE)


def fwd_kernel_args(
    plan: NormPlan, x: Tensor, residual: Tensor | None, weight: Tensor | None, bias: Tensor | None,
    seed: Tensor | None, y: Tensor, res: Tensor | None, mean: Tensor | None, rstd: Tensor,
) -> tuple[tuple[int], dict[str, Any]]:
    """Grid and keyword arguments of ``_norm_fwd_kernel`` (shared with the ahead-of-time compile in ``tools/``)."""
    m, n = x.shape
    cfg = fwd_config(n, plan.max_block_n)
    z_dtype = res.dtype if res is not None else x.dtype
    p = plan.dropout_p
    kwargs = dict(
        X=x, R=residual, W=weight, B=bias, SEED=seed, Y=y, RES=res, MEAN=mean, RSTD=rstd,
        stride_xm=row_stride(x), stride_rm=row_stride(residual), stride_ym=row_stride(y), stride_resm=row_stride(res),
        M=m, N=n, eps=plan.eps, dropout_p=p, dropout_scale=1.0 / (1.0 - p),
        IS_RMS=plan.is_rms, HAS_RES=residual is not None, HAS_W=weight is not None, HAS_B=bias is not None,
        ZERO_CENTERED=plan.zero_centered, HAS_DROPOUT=p > 0, ROUND_MODE=plan.round_mode,
        Z_DTYPE=tl_dtype(z_dtype), W_DTYPE=tl_dtype(weight.dtype if weight is not None else z_dtype),
        Y_DTYPE=tl_dtype(y.dtype), RNE=interpreter_rne(),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, SINGLE_BLOCK=cfg.single_block, num_warps=cfg.num_warps,
        maxnreg=cfg.max_registers,
    )
    return (triton.cdiv(m, cfg.block_m),), kwargs


def launch_forward(
    plan: NormPlan,
    x: Tensor,  # (M, N), unit stride along N
    residual: Tensor | None,  # (M, N)
    weight: Tensor | None,  # (N,)
    bias: Tensor | None,  # (N,)
    seed: Tensor | None,  # (1,) int64, with dropout
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Run the forward; returns ``(y, new_residual, mean, rstd)``, the absent ones as empty tensors.

    ``new_residual = dropout(x) + residual`` in ``plan.norm_dtype``; ``y = norm(new_residual)`` (or
    ``norm(dropout(x))`` without a residual) in ``plan.out_dtype``; mean (LayerNorm only) and rstd: fp32, one per row.
    """
    m, n = x.shape
    has_res = residual is not None
    y = empty((m, n), plan.out_dtype, x.device)
    res = empty((m, n) if has_res else (0,), plan.norm_dtype, x.device)
    mean = empty((m if not plan.is_rms else 0,), torch.float32, x.device)
    rstd = empty((m,), torch.float32, x.device)
    if m > 0:
        grid, kwargs = fwd_kernel_args(
            plan, x, residual, weight, bias, seed, y, res if has_res else None, None if plan.is_rms else mean, rstd
        )
        _norm_fwd_kernel[grid](**kwargs)
    return y, res, mean, rstd
