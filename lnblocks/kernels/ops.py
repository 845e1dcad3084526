"""``torch.library`` custom ops around the kernels, with fake (meta) implementations.

Opaque custom ops are what lets ``torch.compile(fullgraph=True)`` trace a model that calls the kernels without a
graph break (FakeTensor tracing broke flash-attn's Triton RMSNorm, pytorch#121526; quack#18). Ops take 2-D
``(M, N)`` operands and return fresh tensors (absent outputs are empty tensors: custom ops return no ``None``).
Eager calls skip the op dispatcher and run ``fwd_impl``/``bwd_impl`` (the ops' own bodies) from an
``autograd.Function`` (``lnblocks.kernels.autograd``): the same kernels with less Python per call.

- ``lnblocks::norm_fwd``: ``(y, new_residual, mean, rstd)``
- ``lnblocks::norm_bwd``: ``(dx, dresidual, dweight, dbias)``
- ``lnblocks::norm_bwd_inplace``: same, but dx is written into ``dy`` (opt-in; Liger's default, which corrupts
  models that reuse ``dy``, Liger#370), returns ``(dresidual, dweight, dbias)``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lnblocks.kernels import norm_bwd as _bwd
from lnblocks.kernels import norm_fwd as _fwd


def fwd_impl(
    x: Tensor,
    residual: Tensor | None,
    weight: Tensor | None,
    bias: Tensor | None,
    seed: Tensor | None,
    eps: float,
    is_rms: bool,
    zero_centered: bool,
    round_mode: int,
    dropout_p: float,
    residual_dtype: torch.dtype,
    out_dtype: torch.dtype,
    max_block_n: int,
    inplace_backward: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Fused (dropout +) residual add + LayerNorm/RMSNorm forward. ``inplace_backward`` only matters to autograd."""
    return _fwd.norm_fwd(
        x,
        residual,
        weight,
        bias,
        seed,
        eps=eps,
        is_rms=is_rms,
        zero_centered=zero_centered,
        round_mode=round_mode,
        dropout_p=dropout_p,
        residual_dtype=residual_dtype,
        out_dtype=out_dtype,
        max_block_n=max_block_n,
    )


norm_fwd = torch.library.custom_op("lnblocks::norm_fwd", fwd_impl, mutates_args=())


@norm_fwd.register_fake
def _norm_fwd_fake(
    x,
    residual,
    weight,
    bias,
    seed,
    eps,
    is_rms,
    zero_centered,
    round_mode,
    dropout_p,
    residual_dtype,
    out_dtype,
    max_block_n,
    inplace_backward,
):
    m, n = x.shape
    y = x.new_empty((m, n), dtype=out_dtype)
    res = x.new_empty((m, n) if residual is not None else (0,), dtype=residual_dtype)
    mean = x.new_empty((0,) if is_rms else (m,), dtype=torch.float32)
    rstd = x.new_empty((m,), dtype=torch.float32)
    return y, res, mean, rstd


def bwd_impl(
    dy,
    dres_out,
    z,
    weight,
    seed,
    mean,
    rstd,
    is_rms,
    zero_centered,
    round_mode,
    dropout_p,
    recompute_dropout,
    x_dtype,
    dres_dtype,
    compute_dw,
    compute_db,
    max_block_n,
    dx_out=None,
):
    """Body of ``norm_bwd`` (and, with ``dx_out=dy``, of ``norm_bwd_inplace``)."""
    return _bwd.norm_bwd(
        dy,
        dres_out,
        z,
        weight,
        seed,
        mean,
        rstd,
        is_rms=is_rms,
        zero_centered=zero_centered,
        round_mode=round_mode,
        dropout_p=dropout_p,
        recompute_dropout=recompute_dropout,
        x_dtype=x_dtype,
        dres_dtype=dres_dtype,
        compute_dw=compute_dw,
        compute_db=compute_db,
        max_block_n=max_block_n,
        dx_out=dx_out,
    )


def _bwd_fake_grads(z, dres_dtype, x_dtype, compute_dw, compute_db):
    m, n = z.shape
    dres = z.new_empty((m, n) if dres_dtype is not None else (0,), dtype=dres_dtype or x_dtype)
    dw = z.new_empty((n,) if compute_dw else (0,), dtype=torch.float32)
    db = z.new_empty((n,) if compute_db else (0,), dtype=torch.float32)
    return dres, dw, db


@torch.library.custom_op("lnblocks::norm_bwd", mutates_args=())
def norm_bwd(
    dy: Tensor,
    dres_out: Tensor | None,
    z: Tensor,
    weight: Tensor | None,
    seed: Tensor | None,
    mean: Tensor,
    rstd: Tensor,
    is_rms: bool,
    zero_centered: bool,
    round_mode: int,
    dropout_p: float,
    recompute_dropout: bool,
    x_dtype: torch.dtype,
    dres_dtype: torch.dtype | None,
    compute_dw: bool,
    compute_db: bool,
    max_block_n: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Backward of ``norm_fwd``: dx (``x_dtype``), dresidual (only when ``dres_dtype``), fp32 dweight and dbias."""
    return bwd_impl(
        dy,
        dres_out,
        z,
        weight,
        seed,
        mean,
        rstd,
        is_rms,
        zero_centered,
        round_mode,
        dropout_p,
        recompute_dropout,
        x_dtype,
        dres_dtype,
        compute_dw,
        compute_db,
        max_block_n,
    )


@norm_bwd.register_fake
def _norm_bwd_fake(
    dy,
    dres_out,
    z,
    weight,
    seed,
    mean,
    rstd,
    is_rms,
    zero_centered,
    round_mode,
    dropout_p,
    recompute_dropout,
    x_dtype,
    dres_dtype,
    compute_dw,
    compute_db,
    max_block_n,
):
    dx = z.new_empty(z.shape, dtype=x_dtype)
    return (dx, *_bwd_fake_grads(z, dres_dtype, x_dtype, compute_dw, compute_db))


@torch.library.custom_op("lnblocks::norm_bwd_inplace", mutates_args=("dy",))
def norm_bwd_inplace(
    dy: Tensor,
    dres_out: Tensor | None,
    z: Tensor,
    weight: Tensor | None,
    seed: Tensor | None,
    mean: Tensor,
    rstd: Tensor,
    is_rms: bool,
    zero_centered: bool,
    round_mode: int,
    dropout_p: float,
    recompute_dropout: bool,
    x_dtype: torch.dtype,
    dres_dtype: torch.dtype | None,
    compute_dw: bool,
    compute_db: bool,
    max_block_n: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """``norm_bwd`` writing dx into ``dy`` (which must be contiguous and of ``x_dtype``)."""
    _, dres, dw, db = bwd_impl(
        dy,
        dres_out,
        z,
        weight,
        seed,
        mean,
        rstd,
        is_rms,
        zero_centered,
        round_mode,
        dropout_p,
        recompute_dropout,
        x_dtype,
        dres_dtype,
        compute_dw,
        compute_db,
        max_block_n,
        dx_out=dy,
    )
    return dres, dw, db


@norm_bwd_inplace.register_fake
def _norm_bwd_inplace_fake(
    dy,
    dres_out,
    z,
    weight,
    seed,
    mean,
    rstd,
    is_rms,
    zero_centered,
    round_mode,
    dropout_p,
    recompute_dropout,
    x_dtype,
    dres_dtype,
    compute_dw,
    compute_db,
    max_block_n,
):
    return _bwd_fake_grads(z, dres_dtype, x_dtype, compute_dw, compute_db)
