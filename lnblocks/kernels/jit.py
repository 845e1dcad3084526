"""The Triton kernels of the fused norms: the forward, the backward and the dropout keep-mask (device code only; the
shared helpers are ``jit_helpers``, the launchers ``launch``).

Forward (``norm_fwd_kernel``): one pass over memory, reading x (and the residual, the gate) and writing y (and the new
residual), plus fp32 mean/rstd per row (per group) for the backward. Rows that fit in registers are normalised from
registers (flash-attn's layout, several rows per program when N is small); wider rows loop over chunks with a
per-lane Welford/Chan merge for stable statistics.

One kernel serves every kind, chosen by constexprs (so each configuration compiles to the code it needs, nothing
more): LayerNorm and RMSNorm statistics (``IS_RMS``; ``L2_SUM``: the sum of squares of ``l2norm(reduction="sum")``),
or none (``POINTWISE``: DyT's ``tanh``, Derf's ``erf``); a gate before or after the norm (``GATE_MODE``); groups (a
second grid axis over groups of ``N`` columns: per-group statistics, the grouped and per-head norms); the residual
added before the norm (pre-norm) or after it (``NORM_THEN_ADD``, with ``WRITE_Y`` saying whether y is written).

Backward (``norm_bwd_kernel``): a persistent grid; each program owns a contiguous range of rows (of one group, on the
second grid axis), accumulates its dW/dB (and the point-wise norms' d_alpha/d_shift) contributions in fp32 registers
and writes one partial row, which the launcher sums in a fixed order (deterministic, no atomics). Every program
writes its partials, even one that owns no rows (flash-attn#781). x_hat is recomputed from the saved input and fp32
mean/rstd (or, ``FROM_OUTPUT``, rebuilt from the saved output: ``(y - b) / w``, the memory-efficient backward), the
dropout mask from the seed. Rows
wider than one block loop over chunks twice (row sums, then outputs) and accumulate into the program's partial row.

Per kind: LayerNorm/RMSNorm ``dz = rstd * (g - x_hat * c1 - c2)`` with ``g = dy * w``; a gate before the norm
multiplies dz by ``act(gate)`` and its gradient is ``dz * x * act'(gate)``; a gate after it scales dy by ``act(gate)``
and its gradient is ``dy * (w * x_hat) * act'(gate)``; the point-wise norms (``f = tanh`` or ``erf`` of
``u = alpha * z + shift``) have ``dz = dy * w * f'(u) * alpha``, ``d_alpha = sum(dy * w * f'(u) * z)``,
``d_shift = sum(dy * w * f'(u))``. Norm-then-add: the gradient of y is the new residual's, rounded to y's dtype.
"""

from __future__ import annotations

import triton
import triton.language as tl

from lnblocks.kernels.jit_helpers import (
    gate_act,
    keep_mask,
    load_scalar,
    load_weight,
    load_z,
    pointwise_act,
    round_hat,
    round_to,
    tile,
)


# ---- forward ------------------------------------------------------------------------------------------------------
# fmt: off
@triton.jit
def _normalize_store(z, mean, rstd, W, B, Y, R, RES, GATE, ALPHA, SHIFT, rows, cols, mask, stride_ym, stride_rm,
                     stride_resm, stride_gm, N,
                     IS_RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, ZERO_CENTERED: tl.constexpr,
                     ROUND_MODE: tl.constexpr, Z_DTYPE: tl.constexpr, W_DTYPE: tl.constexpr, Y_DTYPE: tl.constexpr,
                     RNE: tl.constexpr, POINTWISE: tl.constexpr, GATE_MODE: tl.constexpr, GATE_ACT: tl.constexpr,
                     ROUND_PRODUCT: tl.constexpr, NORM_THEN_ADD: tl.constexpr, WRITE_Y: tl.constexpr,
                     RES_DTYPE: tl.constexpr):
# fmt: on
    """y of a tile from the norm's input ``z`` and the row statistics; stores y and, norm-then-add, residual + y."""
    if POINTWISE:
        h, _ = pointwise_act(load_scalar(ALPHA) * z + (load_scalar(SHIFT) if POINTWISE == 2 else 0.0), POINTWISE)
    else:
        h = z * rstd[:, None] if IS_RMS else (z - mean[:, None]) * rstd[:, None]
        h = round_hat(h, ROUND_MODE, Z_DTYPE, W_DTYPE, RNE)
    if HAS_W:
        h = h * load_weight(W, cols, N, ZERO_CENTERED, W_DTYPE, RNE)[None, :]
    if HAS_B:
        h += tl.load(B + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    if GATE_MODE == 2:  # the gate after the norm: y = (w * x_hat) * act(gate), the product rounded as HF rounds it
        if ROUND_PRODUCT:
            h = round_to(h, Z_DTYPE, RNE).to(tl.float32)
        a, _ = gate_act(tile(GATE, rows, cols, stride_gm, mask), GATE_ACT)
        h = h * a
    y = round_to(h, Y_DTYPE, RNE)
    if WRITE_Y:
        tl.store(Y + rows[:, None] * stride_ym + cols[None, :], y, mask=mask)
    if NORM_THEN_ADD:  # the new residual: residual + y, y rounded first (what `residual + norm(x)` adds)
        res = y.to(tl.float32) + tile(R, rows, cols, stride_rm, mask)
        tl.store(RES + rows[:, None] * stride_resm + cols[None, :], round_to(res, RES_DTYPE, RNE), mask=mask)


# fmt: off
@triton.jit
def _norm_input(X, R, SEED, GATE, rows, cols, mask, stride_xm, stride_rm, stride_gm, N, dropout_p, dropout_scale,
                HAS_RES: tl.constexpr, HAS_DROPOUT: tl.constexpr, Z_DTYPE: tl.constexpr, RNE: tl.constexpr,
                GATE_MODE: tl.constexpr, GATE_ACT: tl.constexpr):
# fmt: on
    """``(z, the new residual)``: what the norm normalises (gated before the norm when ``GATE_MODE == 1``)."""
    r = load_z(X, R, SEED, rows, cols, mask, stride_xm, stride_rm, N, dropout_p, dropout_scale,
               HAS_RES, HAS_DROPOUT, Z_DTYPE, RNE)  # fmt: skip
    z = r
    if GATE_MODE == 1:
        a, _ = gate_act(tile(GATE, rows, cols, stride_gm, mask), GATE_ACT)
        z = r * a
    return z, r


# fmt: off
@triton.jit
def norm_fwd_kernel(
    X, R, W, B, SEED, Y, RES, MEAN, RSTD, GATE, ALPHA, SHIFT,
    stride_xm, stride_rm, stride_ym, stride_resm, stride_gm,
    M, N, G, eps, dropout_p, dropout_scale,
    IS_RMS: tl.constexpr, HAS_RES: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
    ZERO_CENTERED: tl.constexpr, HAS_DROPOUT: tl.constexpr, ROUND_MODE: tl.constexpr,
    Z_DTYPE: tl.constexpr, W_DTYPE: tl.constexpr, Y_DTYPE: tl.constexpr, RNE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SINGLE_BLOCK: tl.constexpr,
    POINTWISE: tl.constexpr, L2_SUM: tl.constexpr, GROUPED: tl.constexpr, GATE_MODE: tl.constexpr,
    GATE_ACT: tl.constexpr, ROUND_PRODUCT: tl.constexpr, NORM_THEN_ADD: tl.constexpr, WRITE_Y: tl.constexpr,
    RES_DTYPE: tl.constexpr,
):
# fmt: on
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # (BM,) int64 row offsets
    row_mask = rows < M
    stat_rows = rows
    if GROUPED:  # program (i, g) normalises group g of its rows: columns [g * N, (g + 1) * N)
        group = tl.program_id(1).to(tl.int64)
        X += group * N
        Y += group * N
        if HAS_W:
            W += group * N
        if HAS_RES:
            R += group * N
            RES += group * N
        if HAS_B:
            B += group * N
        if GATE_MODE != 0:
            GATE += group * N
        stat_rows = rows * G + group
    ADD_FIRST: tl.constexpr = HAS_RES and not NORM_THEN_ADD  # pre-norm: the residual is added before the norm
    if SINGLE_BLOCK:
        cols = tl.arange(0, BLOCK_N)
        mask = row_mask[:, None] & (cols < N)[None, :]
        z, r = _norm_input(X, R, SEED, GATE, rows, cols, mask, stride_xm, stride_rm, stride_gm, N, dropout_p,
                           dropout_scale, ADD_FIRST, HAS_DROPOUT, Z_DTYPE, RNE, GATE_MODE, GATE_ACT)  # (BM, BN) fp32
        if ADD_FIRST:
            tl.store(RES + rows[:, None] * stride_resm + cols[None, :], r, mask=mask)  # already rounded
        mean = tl.zeros((BLOCK_M,), tl.float32)
        if POINTWISE:
            var = tl.zeros((BLOCK_M,), tl.float32)
        elif IS_RMS:
            var = tl.sum(z * z, axis=1) if L2_SUM else tl.sum(z * z, axis=1) / N
        else:
            mean = tl.sum(z, axis=1) / N
            zc = tl.where(mask, z - mean[:, None], 0.0)
            var = tl.sum(zc * zc, axis=1) / N
    else:
        # Pass 1: statistics over chunks. Each lane keeps a Welford mean/M2 of the elements it saw; lanes are merged
        # with Chan's formula, so a large common offset does not cancel catastrophically as E[x^2] - E[x]^2 would.
        # The point-wise norms need no statistics: they skip it.
        lane_mean = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        lane_m2 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        lane_n = tl.zeros((BLOCK_N,), tl.float32)
        if not POINTWISE:
            for start in range(0, N, BLOCK_N):
                cols = start + tl.arange(0, BLOCK_N)
                col_mask = cols < N
                mask = row_mask[:, None] & col_mask[None, :]
                z, r = _norm_input(X, R, SEED, GATE, rows, cols, mask, stride_xm, stride_rm, stride_gm, N, dropout_p,
                                   dropout_scale, ADD_FIRST, HAS_DROPOUT, Z_DTYPE, RNE, GATE_MODE, GATE_ACT)
                if ADD_FIRST:
                    tl.store(RES + rows[:, None] * stride_resm + cols[None, :], r, mask=mask)
                if IS_RMS:
                    lane_m2 += z * z
                else:
                    lane_n += col_mask.to(tl.float32)
                    delta = tl.where(col_mask[None, :], z - lane_mean, 0.0)
                    lane_mean += delta / tl.maximum(lane_n, 1.0)[None, :]
                    lane_m2 += delta * (z - lane_mean)
        mean = tl.zeros((BLOCK_M,), tl.float32)
        if POINTWISE:
            var = tl.zeros((BLOCK_M,), tl.float32)
        elif IS_RMS:
            var = tl.sum(lane_m2, axis=1) if L2_SUM else tl.sum(lane_m2, axis=1) / N
        else:
            mean = tl.sum(lane_mean * lane_n[None, :], axis=1) / N
            d = lane_mean - mean[:, None]
            var = tl.sum(lane_m2 + lane_n[None, :] * d * d, axis=1) / N
    rstd = var if POINTWISE else tl.rsqrt(var + eps)  # (the point-wise norms have no statistics)
    if not POINTWISE:
        if not IS_RMS:
            tl.store(MEAN + stat_rows, mean, mask=row_mask)
        tl.store(RSTD + stat_rows, rstd, mask=row_mask)
    if SINGLE_BLOCK:
        _normalize_store(z, mean, rstd, W, B, Y, R, RES, GATE, ALPHA, SHIFT, rows, cols, mask, stride_ym, stride_rm,
                         stride_resm, stride_gm, N, IS_RMS, HAS_W, HAS_B, ZERO_CENTERED, ROUND_MODE, Z_DTYPE, W_DTYPE,
                         Y_DTYPE, RNE, POINTWISE, GATE_MODE, GATE_ACT, ROUND_PRODUCT, NORM_THEN_ADD, WRITE_Y,
                         RES_DTYPE)
    else:
        # Pass 2: recompute z from the inputs (not from RES: another thread of this program may have written it).
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = row_mask[:, None] & (cols < N)[None, :]
            z, r = _norm_input(X, R, SEED, GATE, rows, cols, mask, stride_xm, stride_rm, stride_gm, N, dropout_p,
                               dropout_scale, ADD_FIRST, HAS_DROPOUT, Z_DTYPE, RNE, GATE_MODE, GATE_ACT)
            if POINTWISE and ADD_FIRST:  # (no pass 1 stored it)
                tl.store(RES + rows[:, None] * stride_resm + cols[None, :], r, mask=mask)
            _normalize_store(z, mean, rstd, W, B, Y, R, RES, GATE, ALPHA, SHIFT, rows, cols, mask, stride_ym,
                             stride_rm, stride_resm, stride_gm, N, IS_RMS, HAS_W, HAS_B, ZERO_CENTERED, ROUND_MODE,
                             Z_DTYPE, W_DTYPE, Y_DTYPE, RNE, POINTWISE, GATE_MODE, GATE_ACT, ROUND_PRODUCT,
                             NORM_THEN_ADD, WRITE_Y, RES_DTYPE)



# ---- backward -------------------------------------------------------------------------------------------------------
# fmt: off
@triton.jit
def _bwd_inputs(Z, DY, DRES_OUT, W, B, SEED, GATE, rows, cols, mask, mean, rstd, stride_zm, stride_dym, stride_drom,
                stride_gm, N, dropout_p, dropout_scale,
                IS_RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, ZERO_CENTERED: tl.constexpr,
                RECOMPUTE_DROPOUT: tl.constexpr, POINTWISE: tl.constexpr, GATE_MODE: tl.constexpr,
                GATE_ACT: tl.constexpr, ROUND_MODE: tl.constexpr, ROUND_PRODUCT: tl.constexpr,
                NORM_THEN_ADD: tl.constexpr, HAS_DY: tl.constexpr, HAS_DRES_OUT: tl.constexpr,
                FROM_OUTPUT: tl.constexpr, Z_DTYPE: tl.constexpr, W_DTYPE: tl.constexpr, Y_DTYPE: tl.constexpr,
                RNE: tl.constexpr):
# fmt: on
    """``(x_hat, dy, z, act(gate), act'(gate), d_gate, w_eff)`` of a tile, fp32: dy is the gradient of the affine
    output (after a gate that follows the norm), z the saved input (gate not applied), d_gate a following gate's."""
    w = load_weight(W, cols, N, ZERO_CENTERED, W_DTYPE, RNE) if HAS_W else tl.zeros((1,), tl.float32) + 1.0
    z = tile(Z, rows, cols, stride_zm, mask)
    if RECOMPUTE_DROPOUT:  # no residual: the saved input is x itself, the norm saw dropout(x)
        z = tl.where(keep_mask(SEED, rows, cols, N, dropout_p), z * dropout_scale, 0.0)
    a = tl.zeros_like(z) + 1.0
    da = tl.zeros_like(z)
    if GATE_MODE != 0:
        a, da = gate_act(tile(GATE, rows, cols, stride_gm, mask), GATE_ACT)
    if FROM_OUTPUT:  # z is y = x_hat * w + b, rounded: x_hat = (y - b) / w (w is checked away from zero)
        if HAS_B:
            z -= tl.load(B + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        xhat = tl.where(mask, z / tl.where(cols < N, w, 1.0)[None, :], 0.0) if HAS_W else z
    elif POINTWISE:
        xhat = z
    else:
        zg = z * a if GATE_MODE == 1 else z
        xhat = zg * rstd[:, None] if IS_RMS else tl.where(mask, (zg - mean[:, None]) * rstd[:, None], 0.0)
    if NORM_THEN_ADD:  # y's gradient through `residual + y`: the new residual's, in y's dtype (+ y's own)
        dy = tl.zeros_like(z)
        if HAS_DRES_OUT:
            dy = round_to(tile(DRES_OUT, rows, cols, stride_drom, mask), Y_DTYPE, RNE).to(tl.float32)
        if HAS_DY:
            dy += tile(DY, rows, cols, stride_dym, mask)
    else:
        dy = tile(DY, rows, cols, stride_dym, mask)
    dgate = tl.zeros_like(z)
    if GATE_MODE == 2:
        p = round_hat(xhat, ROUND_MODE, Z_DTYPE, W_DTYPE, RNE) * w[None, :]
        if ROUND_PRODUCT:
            p = round_to(p, Z_DTYPE, RNE).to(tl.float32)
        dgate = dy * p * da
        dy = dy * a
    return xhat, dy, z, a, da, dgate, w


# fmt: off
@triton.jit
def _store_grads(dz, DRES_OUT, DRES, DX, DGATE, SEED, rows, cols, mask, stride_drom, stride_dresm, stride_dxm,
                 stride_dgm, N, dropout_p, dropout_scale, dgate, HAS_DRES_OUT: tl.constexpr, STORE_DRES: tl.constexpr,
                 HAS_DROPOUT: tl.constexpr, STORE_DGATE: tl.constexpr, DRES_DTYPE: tl.constexpr,
                 DX_DTYPE: tl.constexpr, DG_DTYPE: tl.constexpr, RNE: tl.constexpr):
# fmt: on
    """dz (gradient of the norm's input) plus the new residual's gradient -> dresidual and dx = dropout'(dz)."""
    if HAS_DRES_OUT:
        dz += tile(DRES_OUT, rows, cols, stride_drom, mask)
    if STORE_DRES:
        tl.store(DRES + rows[:, None] * stride_dresm + cols[None, :], round_to(dz, DRES_DTYPE, RNE), mask=mask)
    if HAS_DROPOUT:
        dz = tl.where(keep_mask(SEED, rows, cols, N, dropout_p), dz * dropout_scale, 0.0)
    tl.store(DX + rows[:, None] * stride_dxm + cols[None, :], round_to(dz, DX_DTYPE, RNE), mask=mask)
    if STORE_DGATE:
        tl.store(DGATE + rows[:, None] * stride_dgm + cols[None, :], round_to(dgate, DG_DTYPE, RNE), mask=mask)


# fmt: off
@triton.jit
def norm_bwd_kernel(
    Z, W, B, SEED, MEAN, RSTD, DY, DRES_OUT, DX, DRES, DW, DB, GATE, DGATE, ALPHA, SHIFT, DALPHA, DSHIFT,
    stride_zm, stride_dym, stride_drom, stride_dxm, stride_dresm, stride_gm, stride_dgm,
    M, N, G, rows_per_program, dropout_p, dropout_scale,
    IS_RMS: tl.constexpr, HAS_W: tl.constexpr, ZERO_CENTERED: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    RECOMPUTE_DROPOUT: tl.constexpr, HAS_DRES_OUT: tl.constexpr, STORE_DRES: tl.constexpr,
    COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr, ROUND_MODE: tl.constexpr,
    Z_DTYPE: tl.constexpr, W_DTYPE: tl.constexpr, DX_DTYPE: tl.constexpr, DRES_DTYPE: tl.constexpr,
    RNE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SINGLE_BLOCK: tl.constexpr,
    POINTWISE: tl.constexpr, L2_SUM: tl.constexpr, GROUPED: tl.constexpr, GATE_MODE: tl.constexpr,
    GATE_ACT: tl.constexpr, ROUND_PRODUCT: tl.constexpr, NORM_THEN_ADD: tl.constexpr, HAS_DY: tl.constexpr,
    FROM_OUTPUT: tl.constexpr, HAS_B: tl.constexpr, STORE_DGATE: tl.constexpr, COMPUTE_DSCALARS: tl.constexpr,
    Y_DTYPE: tl.constexpr, DG_DTYPE: tl.constexpr,
):
# fmt: on
    pid = tl.program_id(0)
    row_start = pid.to(tl.int64) * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, M)
    part = pid.to(tl.int64) * N  # this program's partial row in DW / DB
    group = 0
    if GROUPED:  # program (i, g) owns group g of its rows: columns [g * N, (g + 1) * N) and the partials of group g
        group = tl.program_id(1).to(tl.int64)
        part += group * tl.num_programs(0) * N
        Z += group * N
        DY += group * N
        DX += group * N
        if HAS_W:
            W += group * N
        if HAS_B:
            B += group * N
        if HAS_DRES_OUT or NORM_THEN_ADD:
            DRES_OUT += group * N
        if STORE_DRES:
            DRES += group * N
        if GATE_MODE != 0:
            GATE += group * N
        if STORE_DGATE:
            DGATE += group * N
    da_acc = tl.zeros((BLOCK_N,), tl.float32)  # point-wise norms: d_alpha, d_shift contributions
    ds_acc = tl.zeros((BLOCK_N,), tl.float32)
    if SINGLE_BLOCK:
        cols = tl.arange(0, BLOCK_N)
        dw_acc = tl.zeros((BLOCK_N,), tl.float32)
        db_acc = tl.zeros((BLOCK_N,), tl.float32)
        for tile_start in range(row_start, row_end, BLOCK_M):
            rows = (tile_start + tl.arange(0, BLOCK_M)).to(tl.int64)  # the loop index may arrive as int32
            row_mask = rows < row_end  # never touch the next program's rows (fla#1249)
            mask = row_mask[:, None] & (cols < N)[None, :]
            rstd = tl.zeros((BLOCK_M,), tl.float32)
            mean = rstd
            if not POINTWISE:
                stat_rows = rows * G + group if GROUPED else rows
                rstd = tl.load(RSTD + stat_rows, mask=row_mask, other=0.0)
                if not IS_RMS and not FROM_OUTPUT:
                    mean = tl.load(MEAN + stat_rows, mask=row_mask, other=0.0)
            xhat, dy, z, a, da, dgate, w = _bwd_inputs(
                Z, DY, DRES_OUT, W, B, SEED, GATE, rows, cols, mask, mean, rstd, stride_zm, stride_dym, stride_drom,
                stride_gm, N, dropout_p, dropout_scale, IS_RMS, HAS_W, HAS_B, ZERO_CENTERED, RECOMPUTE_DROPOUT,
                POINTWISE, GATE_MODE, GATE_ACT, ROUND_MODE, ROUND_PRODUCT, NORM_THEN_ADD, HAS_DY, HAS_DRES_OUT,
                FROM_OUTPUT, Z_DTYPE, W_DTYPE, Y_DTYPE, RNE)
            g = dy * w[None, :] if HAS_W else dy
            if POINTWISE:
                alpha = load_scalar(ALPHA)
                f, df = pointwise_act(alpha * z + (load_scalar(SHIFT) if POINTWISE == 2 else 0.0), POINTWISE)
                gf = g * df
                dz = gf * alpha
                if COMPUTE_DSCALARS:
                    da_acc += tl.sum(gf * z, axis=0)
                    ds_acc += tl.sum(gf, axis=0)
                if COMPUTE_DW:
                    dw_acc += tl.sum(dy * f, axis=0)
            else:
                if COMPUTE_DW:
                    dw_acc += tl.sum(dy * round_hat(xhat, ROUND_MODE, Z_DTYPE, W_DTYPE, RNE), axis=0)
                c1 = tl.sum(xhat * g, axis=1) if L2_SUM else tl.sum(xhat * g, axis=1) / N
                if IS_RMS:
                    dz = (g - xhat * c1[:, None]) * rstd[:, None]
                else:
                    c2 = tl.sum(g, axis=1) / N
                    dz = (g - xhat * c1[:, None] - c2[:, None]) * rstd[:, None]
                if GATE_MODE == 1:  # the gate came before the norm: z * act(gate) was normalised
                    dgate = dz * z * da
                    dz = dz * a
            if COMPUTE_DB:
                db_acc += tl.sum(dy, axis=0)
            _store_grads(dz, DRES_OUT, DRES, DX, DGATE, SEED, rows, cols, mask, stride_drom, stride_dresm,
                         stride_dxm, stride_dgm, N, dropout_p, dropout_scale, dgate, HAS_DRES_OUT and not NORM_THEN_ADD,
                         STORE_DRES, HAS_DROPOUT, STORE_DGATE, DRES_DTYPE, DX_DTYPE, DG_DTYPE, RNE)
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
        for tile_start in range(row_start, row_end, BLOCK_M):
            rows = (tile_start + tl.arange(0, BLOCK_M)).to(tl.int64)  # the loop index may arrive as int32
            row_mask = rows < row_end
            rstd = tl.zeros((BLOCK_M,), tl.float32)
            mean = rstd
            if not POINTWISE:
                stat_rows = rows * G + group if GROUPED else rows
                rstd = tl.load(RSTD + stat_rows, mask=row_mask, other=0.0)
                if not IS_RMS and not FROM_OUTPUT:
                    mean = tl.load(MEAN + stat_rows, mask=row_mask, other=0.0)
            acc1 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            acc2 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            if not POINTWISE:
                for start in range(0, N, BLOCK_N):  # pass A: the two row sums
                    cols = start + tl.arange(0, BLOCK_N)
                    mask = row_mask[:, None] & (cols < N)[None, :]
                    xhat, dy, z, a, da, dgate, w = _bwd_inputs(
                        Z, DY, DRES_OUT, W, B, SEED, GATE, rows, cols, mask, mean, rstd, stride_zm, stride_dym,
                        stride_drom, stride_gm, N, dropout_p, dropout_scale, IS_RMS, HAS_W, HAS_B, ZERO_CENTERED,
                        RECOMPUTE_DROPOUT, POINTWISE, GATE_MODE, GATE_ACT, ROUND_MODE, ROUND_PRODUCT, NORM_THEN_ADD,
                        HAS_DY, HAS_DRES_OUT, FROM_OUTPUT, Z_DTYPE, W_DTYPE, Y_DTYPE, RNE)
                    g = dy * w[None, :] if HAS_W else dy
                    acc1 += xhat * g
                    acc2 += g
            c1 = tl.sum(acc1, axis=1) if L2_SUM else tl.sum(acc1, axis=1) / N
            c2 = tl.sum(acc2, axis=1) / N
            for start in range(0, N, BLOCK_N):  # pass B: outputs, and dW/dB into the partial row
                cols = start + tl.arange(0, BLOCK_N)
                mask = row_mask[:, None] & (cols < N)[None, :]
                xhat, dy, z, a, da, dgate, w = _bwd_inputs(
                    Z, DY, DRES_OUT, W, B, SEED, GATE, rows, cols, mask, mean, rstd, stride_zm, stride_dym,
                    stride_drom, stride_gm, N, dropout_p, dropout_scale, IS_RMS, HAS_W, HAS_B, ZERO_CENTERED,
                    RECOMPUTE_DROPOUT, POINTWISE, GATE_MODE, GATE_ACT, ROUND_MODE, ROUND_PRODUCT, NORM_THEN_ADD,
                    HAS_DY, HAS_DRES_OUT, FROM_OUTPUT, Z_DTYPE, W_DTYPE, Y_DTYPE, RNE)
                g = dy * w[None, :] if HAS_W else dy
                if POINTWISE:
                    alpha = load_scalar(ALPHA)
                    f, df = pointwise_act(alpha * z + (load_scalar(SHIFT) if POINTWISE == 2 else 0.0), POINTWISE)
                    gf = g * df
                    dz = gf * alpha
                    if COMPUTE_DSCALARS:
                        da_acc += tl.sum(gf * z, axis=0)
                        ds_acc += tl.sum(gf, axis=0)
                    hat = f
                else:
                    if IS_RMS:
                        dz = (g - xhat * c1[:, None]) * rstd[:, None]
                    else:
                        dz = (g - xhat * c1[:, None] - c2[:, None]) * rstd[:, None]
                    if GATE_MODE == 1:
                        dgate = dz * z * da
                        dz = dz * a
                    hat = round_hat(xhat, ROUND_MODE, Z_DTYPE, W_DTYPE, RNE)
                _store_grads(dz, DRES_OUT, DRES, DX, DGATE, SEED, rows, cols, mask, stride_drom, stride_dresm,
                             stride_dxm, stride_dgm, N, dropout_p, dropout_scale, dgate,
                             HAS_DRES_OUT and not NORM_THEN_ADD, STORE_DRES, HAS_DROPOUT, STORE_DGATE, DRES_DTYPE,
                             DX_DTYPE, DG_DTYPE, RNE)
                if COMPUTE_DW:
                    dw = tl.sum(dy * hat, axis=0)
                    tl.store(DW + part + cols, tl.load(DW + part + cols, mask=cols < N) + dw, mask=cols < N)
                if COMPUTE_DB:
                    db = tl.sum(dy, axis=0)
                    tl.store(DB + part + cols, tl.load(DB + part + cols, mask=cols < N) + db, mask=cols < N)
            tl.debug_barrier()  # the next row reads the partial row this one wrote, possibly from other threads
    if COMPUTE_DSCALARS:  # one partial per program (written even if it owns no rows)
        tl.store(DALPHA + pid, tl.sum(da_acc, axis=0))
        if POINTWISE == 2:
            tl.store(DSHIFT + pid, tl.sum(ds_acc, axis=0))


# ---- dropout keep-mask, materialised -------------------------------------------------------------------------------
@triton.jit
def keep_mask_kernel(SEED, OUT, M, N, p, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) + tl.arange(0, 1)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    keep = keep_mask(SEED, rows, cols, N, p)
    tl.store(OUT + rows[:, None] * N + cols[None, :], keep.to(tl.int8), mask=(cols < N)[None, :])
