"""The Triton kernels of the fused norms: shared JIT helpers, the forward, the backward and the dropout keep-mask.

Forward (``norm_fwd_kernel``): one pass over memory, reading x (and the residual) and writing y (and the new
residual), plus fp32 mean/rstd per row for the backward. Rows that fit in registers are normalised from registers
(flash-attn's layout, several rows per program when N is small); wider rows loop over chunks with a per-lane
Welford/Chan merge for stable statistics.

Backward (``norm_bwd_kernel``): a persistent grid; each program owns a contiguous range of rows, accumulates its
dW/dB contributions in fp32 registers and writes one partial row, which the launcher sums in a fixed order
(deterministic, no atomics). Every program writes its partial row, even one that owns no rows (flash-attn#781).
x_hat is recomputed from the saved input and fp32 mean/rstd, the dropout mask from the seed. Rows wider than one
block loop over chunks twice (row sums, then outputs) and accumulate dW/dB into the program's own partial row.

The launchers (grids, block shapes, argument lists) are in ``lnblocks.kernels.launch``; this module holds device code
only.
"""

from __future__ import annotations

import triton
import triton.language as tl

# ---- shared helpers ------------------------------------------------------------------------------------------------
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


# ---- forward ------------------------------------------------------------------------------------------------------
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
def norm_fwd_kernel(
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


# ---- backward -----------------------------------------------------------------------------------------------------
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
def norm_bwd_kernel(
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


# ---- dropout keep-mask, materialised -------------------------------------------------------------------------------
@triton.jit
def keep_mask_kernel(SEED, OUT, M, N, p, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) + tl.arange(0, 1)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    keep = keep_mask(SEED, rows, cols, N, p)
    tl.store(OUT + rows[:, None] * N + cols[None, :], keep.to(tl.int8), mask=(cols < N)[None, :])
