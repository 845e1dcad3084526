"""Launchers of the fused norm kernels: launch shapes picked from N, argument lists, grids, allocation.

Every launch choice is a function of the hidden size N, the element size and the device's SM count, never of the row
count M: autotuning keyed on M recompiles on every new batch shape (fla#533), and so does a ``tl.constexpr`` that
changes with M (Liger's ``rows_per_program``). No CUDA query happens at import time (the SM count is read once per
device, on first use). Operands arrive 2-D ``(M, N)`` with unit column stride; every output is written in full by the
kernels (the tests poison ``torch.empty`` with NaN to prove it).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from lnblocks.kernels.jit import keep_mask_kernel, norm_bwd_kernel, norm_fwd_kernel
from lnblocks.kernels.plan import NormPlan, interpreter_enabled

# ---- launch shapes -------------------------------------------------------------------------------------------------
# Tile sizes, chosen with benchmarks/kernels/kernel_resources.py (every configuration compiled for sm_80 and sm_90;
# the table is in benchmarks/kernels/README.md). A thread holds about ELEMENTS_PER_THREAD elements of each live array
# of a tile; at 32 warps ptxas caps a thread at 64 registers, which a whole row of 16384 (16 elements per thread and
# array) overflows:
# 88-784 bytes of spills, the worst in the backward with dropout, whose Philox rounds need registers of their own.
# So rows wider than MAX_FWD_BLOCK / MAX_BWD_BLOCK (MAX_BWD_BLOCK_DROPOUT with dropout) loop over LOOP_BLOCK chunks.
# The backward of a gated norm, of DyT/Derf and the memory-efficient one keep more arrays live (the gate and its
# derivative, the activation's derivative, the rebuilt x_hat): at N = 8192 they spilled 8-88 bytes, and the
# memory-efficient LayerNorm 8-16 bytes at N = 4096 with 16 warps. These "heavy" backwards hold at most
# MAX_BWD_BLOCK_HEAVY elements per row and use up to 32 warps (BWD_ELEMENTS_PER_THREAD per thread), in the single
# block and in the loop.
MAX_FWD_BLOCK = 8192
MAX_BWD_BLOCK = 8192
MAX_BWD_BLOCK_DROPOUT = 2048
MAX_BWD_BLOCK_HEAVY = 4096
LOOP_BLOCK = 4096
ELEMENTS_PER_THREAD = 8
BWD_ELEMENTS_PER_THREAD = 4
MAX_WARPS = 32
REGISTERS_PER_SM = 65536  # sm_80 and sm_90
# Register budget of a thread (ptxas's maxnreg): 16 resident warps per SM (a quarter of sm_80/sm_90's 64) at most.
MAX_REGISTERS = 128
# Forward rows per program for small N: keep at least this many elements per program.
TILE_ELEMENTS = 2048
# SM count used on CPU (interpreter): any small constant works; 4 makes "programs that own no rows" easy to reach.
CPU_SM_COUNT = 4


@dataclass(frozen=True)
class LaunchConfig:
    """One kernel launch shape: a (block_m, block_n) tile per step, looped over the row when not ``single_block``."""

    block_m: int
    block_n: int
    num_warps: int
    single_block: bool

    @property
    def max_registers(self) -> int:
        """ptxas's register limit (``maxnreg``): ``MAX_REGISTERS``, or a whole SM's register file at 32 warps.

        Passed explicitly because ptxas, left to choose, trades a few bytes of spills for occupancy in about a dozen
        configurations (4-24 bytes at 40-72 registers, e.g. the sm_80 LayerNorm backward at N = 64); with a limit
        it allocates what the kernel needs and spills nothing, and the limit keeps 16 warps resident per SM.
        """
        return min(MAX_REGISTERS, REGISTERS_PER_SM // (32 * self.num_warps))

    @property
    def programs_per_sm(self) -> int:
        """Programs of this shape that fit on one SM at the register limit (what the persistent backward plans)."""
        return max(1, REGISTERS_PER_SM // (32 * self.num_warps * self.max_registers))


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _warps(elements: int, per_thread: int) -> int:
    """Warps so that each thread holds about ``per_thread`` elements of the tile (1 to ``MAX_WARPS`` warps)."""
    return max(1, min(MAX_WARPS, next_power_of_2(max(1, elements // (32 * per_thread)))))


def _limit(default: int, max_block_n: int | None) -> int:
    if max_block_n is None or max_block_n <= 0:
        return default
    if max_block_n & (max_block_n - 1):
        raise ValueError(f"max_block_n must be a power of two, got {max_block_n}")
    return max_block_n


def fwd_config(n: int, max_block_n: int | None = None) -> LaunchConfig:
    """Forward tile for hidden size ``n``: whole rows (several per program when N is small), else looped chunks."""
    limit = _limit(MAX_FWD_BLOCK, max_block_n)
    block_n = max(16, next_power_of_2(n))
    if block_n > limit:
        chunk = min(LOOP_BLOCK, max_block_n or LOOP_BLOCK)
        return LaunchConfig(1, chunk, _warps(chunk, ELEMENTS_PER_THREAD), single_block=False)
    block_m = max(1, min(64, TILE_ELEMENTS // block_n))
    return LaunchConfig(block_m, block_n, _warps(block_m * block_n, ELEMENTS_PER_THREAD), single_block=True)


def bwd_config(n: int, max_block_n: int | None = None, dropout: bool = False, heavy: bool = False) -> LaunchConfig:
    """Backward tile: x_hat, dy and the dW/dB accumulators are live (and, with ``dropout``, the mask's Philox;
    ``heavy``: a gate, a point-wise activation's derivative or a rebuilt x_hat, see ``MAX_BWD_BLOCK_HEAVY``)."""
    limit = MAX_BWD_BLOCK_DROPOUT if dropout else MAX_BWD_BLOCK_HEAVY if heavy else MAX_BWD_BLOCK
    limit = _limit(limit, max_block_n)
    block_n = max(16, next_power_of_2(n))
    per_thread = BWD_ELEMENTS_PER_THREAD if heavy else ELEMENTS_PER_THREAD
    if block_n > limit:
        chunk = min(LOOP_BLOCK, max_block_n or LOOP_BLOCK)
        return LaunchConfig(1, chunk, _warps(chunk, per_thread), single_block=False)
    block_m = max(1, min(16, TILE_ELEMENTS // block_n))
    tile = block_m * block_n
    # Small tiles: half the forward's elements per thread (up to 16 warps, 32 for the heavy ones). The backward keeps
    # x_hat, dy, their products and the dW/dB accumulators live: over 150 registers at 8 elements per thread for
    # N <= 2048.
    most = MAX_WARPS if heavy else 16
    warps = max(_warps(tile, per_thread), min(most, _warps(tile, BWD_ELEMENTS_PER_THREAD)))
    return LaunchConfig(block_m, block_n, warps, single_block=True)


def heavy_backward(plan: NormPlan) -> bool:
    """The backwards with more live arrays than LayerNorm/RMSNorm's (``bwd_config``'s ``heavy``)."""
    return plan.gate_position != "none" or plan.pointwise > 0 or plan.memory_efficient


@functools.cache
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (queried once per device, never at import); a constant on CPU."""
    if device.type != "cuda":
        return CPU_SM_COUNT
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _cuda_sm_count(index)


def bwd_grid(m: int, cfg: LaunchConfig, device: torch.device) -> tuple[int, int]:
    """``(programs, rows_per_program)`` of the persistent backward.

    Each program owns ``rows_per_program`` consecutive rows and writes one fp32 partial row of dW (and dB); the
    partials are summed afterwards in a fixed order (deterministic, no atomics: Liger#815 -> #945). As many programs
    per SM as fit at the register limit (``LaunchConfig.programs_per_sm``): one wave; the partial traffic
    ``2 * programs * N * 4`` bytes stays a few percent of the backward's ``6 * M * N`` (bf16). The last programs may own
    no rows: they still write zeros.
    """
    per_sm = cfg.programs_per_sm if device.type == "cuda" else 1
    programs = max(1, min(sm_count(device) * per_sm, m))
    rows_per_program = -(-m // programs) if m > 0 else 1
    return programs, rows_per_program


# ---- operands ------------------------------------------------------------------------------------------------------
_TL_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


def tl_dtype(dtype: torch.dtype) -> tl.dtype:
    return _TL_DTYPES[dtype]


def row_stride(t: Tensor | None) -> int:
    """Stride between rows of a 2-D operand (0 for an absent one); columns must have unit stride."""
    return 0 if t is None else t.stride(0)


def _empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """``torch.empty``: the kernels write every element."""
    return torch.empty(shape, dtype=dtype, device=device)


def interpreter_rne() -> bool:
    """Emulate the GPU's round-to-nearest-even fp32 -> bf16 conversion (the CPU interpreter truncates)."""
    return interpreter_enabled()


# ---- forward -------------------------------------------------------------------------------------------------------
def groups_of(plan: NormPlan, n: int) -> tuple[int, int]:
    """``(groups, group_size)`` of rows of ``n`` elements: the kernels' second grid axis and their ``N``."""
    size = plan.group_size or n
    return n // size, size


# fmt: off
def fwd_kernel_args(
    plan: NormPlan, x: Tensor, residual: Tensor | None, weight: Tensor | None, bias: Tensor | None,
    seed: Tensor | None, y: Tensor, res: Tensor | None, mean: Tensor | None, rstd: Tensor | None, *,
    gate: Tensor | None = None, alpha: Tensor | None = None, shift: Tensor | None = None,
) -> tuple[tuple[int, int], dict[str, Any]]:
    """Grid and keyword arguments of ``norm_fwd_kernel`` (compiled ahead of time by
    benchmarks/kernels/kernel_resources.py)."""
    m, n = x.shape
    groups, size = groups_of(plan, n)
    cfg = fwd_config(size, plan.max_block_n)
    z_dtype = res.dtype if res is not None and not plan.norm_then_add else x.dtype
    p = plan.dropout_p
    has_res = residual is not None
    kwargs = dict(
        X=x, R=residual, W=weight, B=bias, SEED=seed, Y=y, RES=res, MEAN=mean, RSTD=rstd, GATE=gate, ALPHA=alpha,
        SHIFT=shift, stride_xm=row_stride(x), stride_rm=row_stride(residual), stride_ym=row_stride(y),
        stride_resm=row_stride(res), stride_gm=row_stride(gate),
        M=m, N=size, G=groups, eps=plan.eps, dropout_p=p, dropout_scale=1.0 / (1.0 - p),
        IS_RMS=plan.is_rms, HAS_RES=has_res, HAS_W=weight is not None, HAS_B=bias is not None,
        ZERO_CENTERED=plan.zero_centered_mode, HAS_DROPOUT=p > 0, ROUND_MODE=plan.round_mode,
        Z_DTYPE=tl_dtype(z_dtype), W_DTYPE=tl_dtype(weight.dtype if weight is not None else z_dtype),
        Y_DTYPE=tl_dtype(plan.out_dtype), RNE=interpreter_rne(),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, SINGLE_BLOCK=cfg.single_block, num_warps=cfg.num_warps,
        maxnreg=cfg.max_registers, POINTWISE=plan.pointwise, L2_SUM=plan.l2_sum, GROUPED=groups > 1,
        GATE_MODE=plan.gate_mode if gate is not None else 0, GATE_ACT=int(plan.activation == "sigmoid"),
        ROUND_PRODUCT=plan.round_product, NORM_THEN_ADD=plan.norm_then_add and has_res,
        WRITE_Y=plan.write_y, RES_DTYPE=tl_dtype(res.dtype if res is not None else z_dtype),
    )
    return (triton.cdiv(m, cfg.block_m), groups), kwargs
# fmt: on


def launch_forward(
    plan: NormPlan,
    x: Tensor,  # (M, N), unit stride along N
    residual: Tensor | None,  # (M, N)
    weight: Tensor | None,  # (N,)
    bias: Tensor | None,  # (N,)
    seed: Tensor | None,  # (1,) int64, with dropout
    *,
    gate: Tensor | None = None,  # (M, N), gated RMSNorm
    alpha: Tensor | None = None,  # (1,), DyT / Derf
    shift: Tensor | None = None,  # (1,), Derf
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Run the forward; returns ``(y, new_residual, mean, rstd)``, the absent ones as empty tensors.

    ``new_residual = dropout(x) + residual`` in ``plan.norm_dtype`` (norm-then-add: ``residual + y`` in
    ``plan.stream_dtype``); ``y = norm(new_residual)`` (or ``norm(dropout(x))``) in ``plan.out_dtype``, empty when
    ``plan.write_y`` is off; mean (LayerNorm only) and rstd: fp32, one per row and group (none for DyT/Derf).
    """
    m, n = x.shape
    groups, _ = groups_of(plan, n)
    has_res = residual is not None
    stats = 0 if plan.pointwise else m * groups
    y = _empty((m, n) if plan.write_y else (0,), plan.out_dtype, x.device)
    res = _empty((m, n) if has_res else (0,), plan.stream_dtype, x.device)
    mean = _empty((stats if not plan.is_rms else 0,), torch.float32, x.device)
    rstd = _empty((stats,), torch.float32, x.device)
    if m > 0:
        grid, kwargs = fwd_kernel_args(
            plan, x, residual, weight, bias, seed, y, res if has_res else None, None if plan.is_rms else mean,
            None if plan.pointwise else rstd, gate=gate, alpha=alpha, shift=shift,
        )  # fmt: skip
        norm_fwd_kernel[grid](**kwargs)
    return y, res, mean, rstd


# ---- backward ------------------------------------------------------------------------------------------------------
class Grads(NamedTuple):
    """What ``launch_backward`` returns: fp32 dweight/dbias/dalpha/dshift sums, the others in their operands'
    dtypes; the ones not asked for are empty tensors."""

    dx: Tensor
    dresidual: Tensor
    dweight: Tensor
    dbias: Tensor
    dgate: Tensor
    dalpha: Tensor
    dshift: Tensor


# fmt: off
def bwd_kernel_args(
    plan: NormPlan, dy: Tensor | None, dres_out: Tensor | None, z: Tensor, weight: Tensor | None,
    seed: Tensor | None, mean: Tensor | None, rstd: Tensor | None, dx: Tensor, dres: Tensor | None,
    dw_part: Tensor | None, db_part: Tensor | None, *, rows_per_program: int, cfg: LaunchConfig,
    bias: Tensor | None = None, gate: Tensor | None = None, dgate: Tensor | None = None,
    alpha: Tensor | None = None, shift: Tensor | None = None, dalpha_part: Tensor | None = None,
    dshift_part: Tensor | None = None, from_output: bool = False,
) -> dict[str, Any]:
    """Keyword arguments of ``norm_bwd_kernel`` (compiled ahead of time by benchmarks/kernels/kernel_resources.py)."""
    m, n = z.shape
    groups, size = groups_of(plan, n)
    p = plan.dropout_p
    gated = gate is not None
    return dict(
        Z=z, W=weight, B=bias if from_output else None, SEED=seed, MEAN=mean, RSTD=rstd, DY=dy, DRES_OUT=dres_out,
        DX=dx, DRES=dres, DW=dw_part, DB=db_part, GATE=gate, DGATE=dgate, ALPHA=alpha, SHIFT=shift,
        DALPHA=dalpha_part, DSHIFT=dshift_part, stride_zm=row_stride(z), stride_dym=row_stride(dy),
        stride_drom=row_stride(dres_out), stride_dxm=row_stride(dx), stride_dresm=row_stride(dres),
        stride_gm=row_stride(gate), stride_dgm=row_stride(dgate),
        M=m, N=size, G=groups, rows_per_program=rows_per_program, dropout_p=p, dropout_scale=1.0 / (1.0 - p),
        IS_RMS=plan.is_rms, HAS_W=weight is not None, ZERO_CENTERED=plan.zero_centered_mode, HAS_DROPOUT=p > 0,
        RECOMPUTE_DROPOUT=not plan.has_residual and p > 0 and not from_output,
        HAS_DRES_OUT=dres_out is not None, STORE_DRES=dres is not None, COMPUTE_DW=dw_part is not None,
        COMPUTE_DB=db_part is not None, ROUND_MODE=plan.round_mode, Z_DTYPE=tl_dtype(plan.norm_dtype),
        W_DTYPE=tl_dtype(weight.dtype if weight is not None else z.dtype), DX_DTYPE=tl_dtype(dx.dtype),
        DRES_DTYPE=tl_dtype(dres.dtype if dres is not None else dx.dtype), RNE=interpreter_rne(),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, SINGLE_BLOCK=cfg.single_block, num_warps=cfg.num_warps,
        maxnreg=cfg.max_registers, POINTWISE=plan.pointwise, L2_SUM=plan.l2_sum, GROUPED=groups > 1,
        GATE_MODE=plan.gate_mode if gated else 0, GATE_ACT=int(plan.activation == "sigmoid"),
        ROUND_PRODUCT=plan.round_product, NORM_THEN_ADD=plan.norm_then_add,
        HAS_DY=dy is not None and dy.numel() > 0, FROM_OUTPUT=from_output,
        HAS_B=from_output and bias is not None, STORE_DGATE=dgate is not None,
        COMPUTE_DSCALARS=dalpha_part is not None, Y_DTYPE=tl_dtype(plan.out_dtype),
        DG_DTYPE=tl_dtype(dgate.dtype if dgate is not None else dx.dtype),
    )
# fmt: on


def launch_backward(
    plan: NormPlan,
    dy: Tensor | None,  # (M, N), gradient of y (None or empty: y unused, norm-then-add only)
    dres_out: Tensor | None,  # (M, N), gradient of the new residual (None: unused downstream)
    z: Tensor,  # (M, N), the saved tensor: the norm's input (x or the new residual), or y (memory-efficient)
    weight: Tensor | None,  # (N,)
    seed: Tensor | None,
    mean: Tensor,  # (M * groups,) fp32, empty for RMSNorm and the point-wise kinds
    rstd: Tensor,  # (M * groups,) fp32, empty for the point-wise kinds
    compute_dw: bool,
    compute_db: bool,
    dx_out: Tensor | None = None,
    *,
    bias: Tensor | None = None,  # (N,), read only by the memory-efficient backward
    gate: Tensor | None = None,  # (M, N)
    alpha: Tensor | None = None,
    shift: Tensor | None = None,
    compute_dgate: bool = False,
    compute_dscalars: bool = False,
) -> Grads:
    """Run the backward (see ``Grads``).

    ``dresidual`` (in the residual's dtype) is written only when ``plan.separate_dresidual``; otherwise the caller
    reuses dx (norm-then-add: the new residual's gradient itself). ``dx_out``: where to write dx (``dy`` itself for
    the opt-in in-place backward). ``plan.memory_efficient``: ``z`` is the saved output y.
    """
    m, n = z.shape
    dev = z.device
    groups, size = groups_of(plan, n)
    separate = plan.separate_dresidual
    dx = dx_out if dx_out is not None else _empty((m, n), plan.x_dtype, dev)
    dres = _empty((m, n) if separate else (0,), plan.residual_dtype if separate else plan.x_dtype, dev)
    dgate = _empty((m, n) if compute_dgate else (0,), gate.dtype if gate is not None else plan.x_dtype, dev)
    cfg = bwd_config(size, plan.max_block_n, plan.dropout_p > 0, heavy_backward(plan))
    programs, rows_per_program = bwd_grid(m, cfg, dev)
    dw_part = _empty((groups * programs, size) if compute_dw else (0,), torch.float32, dev)
    db_part = _empty((groups * programs, size) if compute_db else (0,), torch.float32, dev)
    scalar_parts = [_empty((programs,) if compute_dscalars and (k == 0 or plan.pointwise == 2) else (0,),
                           torch.float32, dev) for k in range(2)]  # fmt: skip
    if m == 0:  # no rows: zero gradients for the parameters
        dw, db = (dw_part.new_zeros((n,) if flag else (0,)) for flag in (compute_dw, compute_db))
        da, ds = (t.new_zeros((1,) if t.numel() else (0,)) for t in scalar_parts)
        return Grads(dx, dres, dw, db, dgate, da, ds)
    kwargs = bwd_kernel_args(
        plan, dy, dres_out, z, weight, seed, None if plan.is_rms else mean, None if plan.pointwise else rstd, dx,
        dres if separate else None, dw_part if compute_dw else None, db_part if compute_db else None,
        rows_per_program=rows_per_program, cfg=cfg, bias=bias, gate=gate, dgate=dgate if compute_dgate else None,
        alpha=alpha, shift=shift, dalpha_part=scalar_parts[0] if compute_dscalars else None,
        dshift_part=scalar_parts[1] if compute_dscalars and plan.pointwise == 2 else None,
        from_output=plan.memory_efficient,
    )  # fmt: skip
    norm_bwd_kernel[(programs, groups)](**kwargs)
    # Fixed-order reduction of the per-program partials: deterministic run to run.
    dw = dw_part.view(groups, programs, size).sum(1).view(n) if compute_dw else dw_part
    db = db_part.view(groups, programs, size).sum(1).view(n) if compute_db else db_part
    da, ds = (t.sum().view(1) if t.numel() else t for t in scalar_parts)
    return Grads(dx, dres, dw, db, dgate, da, ds)


# ---- dropout keep-mask ---------------------------------------------------------------------------------------------
def launch_keep_mask(seed: Tensor, m: int, n: int, p: float, device: torch.device) -> Tensor:
    """The ``(m, n)`` boolean keep-mask the kernels apply with dropout probability ``p`` (``seed``: (1,) int64)."""
    out = _empty((m, n), torch.int8, device)
    if m * n > 0:
        block = min(1024, triton.next_power_of_2(n))
        keep_mask_kernel[(m, triton.cdiv(n, block))](seed, out, m, n, float(p), BLOCK_N=block)
    return out.bool()
