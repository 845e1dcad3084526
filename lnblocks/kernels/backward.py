"""Backward kernel of LayerNorm and RMSNorm (dx, dweight, dbias, dresidual) and its launcher.

A persistent grid: each program owns a contiguous range of rows, accumulates its dW/dB contributions in fp32
registers and writes one partial row; the partial rows are then summed in a fixed order (deterministic, no atomics).
Every program writes its partial row, even one that owns no rows (flash-attn#781). x_hat is recomputed from the
saved input and fp32 mean/rstd; the dropout mask is recomputed from the seed. Rows wider than one block loop over
chunks twice (row sums, then outputs) and accumulate dW/dB into the program's own partial row in memory.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from lnblocks.kernels._jit_common import keep_mask, load_weight, round_hat, round_to
from lnblocks.kernels.heuristics import LaunchConfig, bwd_config, bwd_grid
from lnblocks.kernels.launch import empty, interpreter_rne, row_stride, tl_dtype
from lnblocks.kernels.plan import NormPlan


# fmt: off
@triton.jit
def _load_tile(Z, DY, W, SEED, rows, cols, mask, mean, rstd, stride_zm, stride_dym, N, dropout_p, dropout_scale,
               IS_RMS: tl.constexpr, HAS_W: tl.constexpr, ZERO_CENTERED: tl.constexpr,
               RECOMPUTE_DROPOUT: tl.constexpr):
# fmt: on
    """x_hat, dy and g = dy * w_eff of a tile, all fp32 (zeros outside ``mask``)."""
    z = tl.load(Z + rows[:, None] * stride_zm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if RECOMPUTE_DROPOUT:  # no residual: the saved input is x itself, the norm saw dropout(x)
        z = tl.where(keep_mask(SEED, rows, cols, N, dropout_p), z * dropout_scale, 0.0)
    xhat = z * rstd[:, None] if IS_RMS else tl.where(mask, (z - mean[:, None]) * rstd[:, None], 0.0)
    dy = tl.load(DY + rows[:, None] * stride_dym + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    g = dy * load_weight(W, cols, N, ZERO_CENTERED)[None, :] if HAS_W else dy
    return xhat, dy, g


# fmt: off
@triton.jit
def _store_grads(dz, DRES_OUT, DRES, DX, SEED, rows, cols, mask, stride_drom, stride_dresm, stride_dxm, N,
                 dropout_p, dropout_scale, HAS_DRES_OUT: tl.constexpr, STORE_DRES: tl.constexpr,
                 HAS_DROPOUT: tl.constexpr, DRES_DTYPE: tl.constexpr, DX_DTYPE: tl.constexpr, RNE: tl.constexpr):
# fmt: on
    """dz (gradient of the norm's input) plus the new residual's gradient -> dresidual and dx = dropout'(dz)."""
    if HAS_DRES_OUT:
        dz += tl.load(DRES_OUT + rows[:, None] * stride_drom + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if STORE_DRES:
        tl.store(DRES + rows[:, None] * stride_dresm + cols[None, :], round_to(dz, DRES_DTYPE, RNE), mask=mask)
    if HAS_DROPOUT:
        dz = tl.where(keep_mask(SEED, rows, cols, N, dropout_p), dz * dropout_scale, 0.0)
    tl.store(DX + rows[:, None] * stride_dxm + cols[None, :], round_to(dz, DX_DTYPE, RNE), mask=mask)


# fmt: off
@triton.jit
def _norm_bwd_kernel(
    Z, W, SEED, MEAN, RSTD, DY, DRES_OUT, DX, DRES, DW, DB,
    stride_zm, stride_dym, stride_drom, stride_dxm, stride_dresm,
    M, N, rows_per_program, dropout_p, dropout_scale,
    IS_RMS: tl.constexpr, HAS_W: tl.constexpr, ZERO_CENTERED: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    RECOMPUTE_DROPOUT: tl.constexpr, HAS_DRES_OUT: tl.constexpr, STORE_DRES: tl.constexpr,
    COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr, ROUND_MODE: tl.constexpr,
    Z_DTYPE: tl.constexpr, W_DTYPE: tl.constexpr, DX_DTYPE: tl.constexpr, DRES_DTYPE: tl.constexpr,
    RNE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SINGLE_BLOCK: tl.constexpr,
):
# fmt: on
    pid = tl.program_id(0)
    row_start = pid.to(tl.int64) * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, M)
    part = pid.to(tl.int64) * N  # this program's partial row in DW / DB
    if SINGLE_BLOCK:
        cols = tl.arange(0, BLOCK_N)
        dw_acc = tl.zeros((BLOCK_N,), tl.float32)
        db_acc = tl.zeros((BLOCK_N,), tl.float32)
        for tile in range(row_start, row_end, BLOCK_M):
            rows = (tile + tl.arange(0, BLOCK_M)).to(tl.int64)  # the loop index may arrive as int32
            row_mask = rows < row_end  # never touch the next program's rows (fla#1249)
            mask = row_mask[:, None] & (cols < N)[None, :]
            rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
            mean = rstd if IS_RMS else tl.load(MEAN + rows, mask=row_mask, other=0.0)
            xhat, dy, g = _load_tile(Z, DY, W, SEED, rows, cols, mask, mean, rstd, stride_zm, stride_dym, N,
                                     dropout_p, dropout_scale, IS_RMS, HAS_W, ZERO_CENTERED, RECOMPUTE_DROPOUT)
            if COMPUTE_DW:
                dw_acc += tl.sum(dy * round_hat(xhat, ROUND_MODE, Z_DTYPE, W_DTYPE, RNE), axis=0)
            if COMPUTE_DB:
                db_acc += tl.sum(dy, axis=0)
            c1 = tl.sum(xhat * g, axis=1) / N
            if IS_RMS:
                dz = (g - xhat * c1[:, None]) * rstd[:, None]
            else:
                c2 = tl.sum(g, axis=1) / N
                dz = (g - xhat * c1[:, None] - c2[:, None]) * rstd[:, None]
            _store_grads(dz, DRES_OUT, DRES, DX, SEED, rows, cols, mask, stride_drom, stride_dresm, stride_dxm, N,
                         dropout_p, dropout_scale, HAS_DRES_OUT, STORE_DRES, HAS_DROPOUT, DRES_DTYPE, DX_DTYPE, RNE)
        if COMPUTE_DW:
            tl.store(DW + part + cols, dw_acc, mask=cols < N)
        if COMPUTE_DB:
            tl.store(DB + part + cols, db_acc, mask=cols < N)
    else:
        for start in range(0, N, BLOCK_N):  # zero this program's partial rows (written even if it owns no rows)
            cols = start + tl.arange(0, BLOCK_N)
            if COMPUTE_DW:
                tl.store(DW + part + cols, tl.zeros((BLOCK_N,), tl.float32), mask=cols < N)
            if COMPUTE_DB:
                tl.store(DB + part + cols, tl.zeros((BLOCK_N,), tl.float32), mask=cols < N)
        tl.debug_barrier()
        for tile in range(row_start, row_end, BLOCK_M):
            rows = (tile + tl.arange(0, BLOCK_M)).to(tl.int64)  # the loop index may arrive as int32
            row_mask = rows < row_end
            rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
            mean = rstd if IS_RMS else tl.load(MEAN + rows, mask=row_mask, other=0.0)
            acc1 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            acc2 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            for start in range(0, N, BLOCK_N):  # pass A: the two row sums
                cols = start + tl.arange(0, BLOCK_N)
                mask = row_mask[:, None] & (cols < N)[None, :]
                xhat, dy, g = _load_tile(Z, DY, W, SEED, rows, cols, mask, mean, rstd, stride_zm, stride_dym, N,
                                         dropout_p, dropout_scale, IS_RMS, HAS_W, ZERO_CENTERED, RECOMPUTE_DROPOUT)
                acc1 += xhat * g
                acc2 += g
            c1 = tl.sum(acc1, axis=1) / N
            c2 = tl.sum(acc2, axis=1) / N
            for start in range(0, N, BLOCK_N):  # pass B: outputs, and dW/dB into the partial row
                cols = start + tl.arange(0, BLOCK_N)
                mask = row_mask[:, None] & (cols < N)[None, :]
                xhat, dy, g = _load_tile(Z, DY, W, SEED, rows, cols, mask, mean, rstd, stride_zm, stride_dym, N,
                                         dropout_p, dropout_scale, IS_RMS, HAS_W, ZERO_CENTERED, RECOMPUTE_DROPOUT)
                if IS_RMS:
                    dz = (g - xhat * c1[:, None]) * rstd[:, None]
                else:
                    dz = (g - xhat * c1[:, None] - c2[:, None]) * rstd[:, None]
                _store_grads(dz, DRES_OUT, DRES, DX, SEED, rows, cols, mask, stride_drom, stride_dresm, stride_dxm,
                             N, dropout_p, dropout_scale, HAS_DRES_OUT, STORE_DRES, HAS_DROPOUT, DRES_DTYPE,
                             DX_DTYPE, RNE)
                if COMPUTE_DW:
                    dw = tl.sum(dy * round_hat(xhat, ROUND_MODE, Z_DTYPE, W_DTYPE, RNE), axis=0)
                    tl.store(DW + part + cols, tl.load(DW + part + cols, mask=cols < N) + dw, mask=cols < N)
                if COMPUTE_DB:
                    db = tl.sum(dy, axis=0)
                    tl.store(DB + part + cols, tl.load(DB + part + cols, mask=cols < N) + db, mask=cols < N)
            tl.debug_barrier()  # the next row reads the partial row this one wrote, possibly from other threads


def bwd_kernel_args(
    plan: NormPlan, dy: Tensor, dres_out: Tensor | None, z: Tensor, weight: Tensor | None, seed: Tensor | None,
    mean: Tensor | None, rstd: Tensor, dx: Tensor, dres: Tensor | None, dw_part: Tensor | None,
    db_part: Tensor | None, *, rows_per_program: int, cfg: LaunchConfig,
) -> dict[str, Any]:
    """Keyword arguments of ``_norm_bwd_kernel`` (shared with the ahead-of-time compile in ``tools/``)."""
    m, n = z.shape
    p = plan.dropout_p
    return dict(
        Z=z, W=weight, SEED=seed, MEAN=mean, RSTD=rstd, DY=dy, DRES_OUT=dres_out, DX=dx, DRES=dres, DW=dw_part,
        DB=db_part, stride_zm=row_stride(z), stride_dym=row_stride(dy), stride_drom=row_stride(dres_out),
        stride_dxm=row_stride(dx), stride_dresm=row_stride(dres),
        M=m, N=n, rows_per_program=rows_per_program, dropout_p=p, dropout_scale=1.0 / (1.0 - p),
        IS_RMS=plan.is_rms, HAS_W=weight is not None, ZERO_CENTERED=plan.zero_centered, HAS_DROPOUT=p > 0,
        RECOMPUTE_DROPOUT=not plan.has_residual and p > 0, HAS_DRES_OUT=dres_out is not None,
        STORE_DRES=dres is not None, COMPUTE_DW=dw_part is not None, COMPUTE_DB=db_part is not None,
        ROUND_MODE=plan.round_mode, Z_DTYPE=tl_dtype(z.dtype),
        W_DTYPE=tl_dtype(weight.dtype if weight is not None else z.dtype), DX_DTYPE=tl_dtype(dx.dtype),
        DRES_DTYPE=tl_dtype(dres.dtype if dres is not None else dx.dtype), RNE=interpreter_rne(),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, SINGLE_BLOCK=cfg.single_block, num_warps=cfg.num_warps,
        maxnreg=cfg.max_registers,
    )


def launch_backward(
    plan: NormPlan,
    dy: Tensor,  # (M, N), gradient of y
    dres_out: Tensor | None,  # (M, N), gradient of the new residual (None: unused downstream)
    z: Tensor,  # (M, N), the saved norm input: the new residual, or x when there was no residual
    weight: Tensor | None,  # (N,)
    seed: Tensor | None,
    mean: Tensor,  # (M,) fp32, empty for RMSNorm
    rstd: Tensor,  # (M,) fp32
    compute_dw: bool,
    compute_db: bool,
    dx_out: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Run the backward; returns ``(dx, dresidual, dweight, dbias)``, the ones not asked for as empty tensors.

    ``dresidual`` (in the residual's dtype) is written only when ``plan.separate_dresidual``; otherwise the caller
    reuses dx. ``dweight``/``dbias`` are fp32. ``dx_out``: where to write dx (``dy`` itself for the opt-in in-place
    backward).
    """
    m, n = z.shape
    dev = z.device
    separate = plan.separate_dresidual
    dx = dx_out if dx_out is not None else empty((m, n), plan.x_dtype, dev)
    dres = empty((m, n) if separate else (0,), plan.residual_dtype if separate else plan.x_dtype, dev)
    cfg = bwd_config(n, plan.max_block_n, plan.dropout_p > 0)
    programs, rows_per_program = bwd_grid(m, cfg, dev)
    dw_part = empty((programs, n) if compute_dw else (0,), torch.float32, dev)
    db_part = empty((programs, n) if compute_db else (0,), torch.float32, dev)
    if m == 0:  # no rows: zero gradients for the weight and bias
        dw, db = (dw_part.new_zeros((n,) if flag else (0,)) for flag in (compute_dw, compute_db))
        return dx, dres, dw, db
    kwargs = bwd_kernel_args(
        plan, dy, dres_out, z, weight, seed, None if plan.is_rms else mean, rstd, dx, dres if separate else None,
        dw_part if compute_dw else None, db_part if compute_db else None, rows_per_program=rows_per_program, cfg=cfg,
    )
    _norm_bwd_kernel[(programs,)](**kwargs)
    # Fixed-order reduction of the per-program partials: deterministic run to run.
    return dx, dres, dw_part.sum(0) if compute_dw else dw_part, db_part.sum(0) if compute_db else db_part
