"""Autograd of the fused norm: what the forward saves and how the backward kernel is called.

Saved for the backward: the norm's input (the new residual, or x when there is no residual: no extra copy), the
weight, the dropout seed and fp32 mean/rstd; x_hat and the dropout mask are recomputed (flash-attn's scheme).
Two entry points share this logic: ``FusedAddNormFunction`` for eager calls, and the autograd registered on the
``lnblocks::norm_fwd`` custom op for ``torch.compile`` graphs.
"""

from __future__ import annotations

import torch

from lnblocks.kernels import ops


def _setup_context(ctx, inputs, output) -> None:
    (
        x,
        residual,
        weight,
        bias,
        seed,
        _eps,
        is_rms,
        zero_centered,
        round_mode,
        dropout_p,
        _res_dtype,
        _out_dtype,
        max_block_n,
        inplace_backward,
    ) = inputs
    y, new_residual, mean, rstd = output
    has_res = residual is not None
    ctx.save_for_backward(new_residual if has_res else x, weight, seed, mean, rstd)
    ctx.options = dict(
        is_rms=is_rms, zero_centered=zero_centered, round_mode=round_mode, dropout_p=dropout_p, max_block_n=max_block_n
    )
    ctx.has_res = has_res
    ctx.bias_dtype = bias.dtype if bias is not None else None
    ctx.x_dtype = x.dtype
    ctx.res_dtype = residual.dtype if has_res else None
    ctx.y_dtype = y.dtype
    ctx.inplace_backward = inplace_backward
    ctx.set_materialize_grads(False)  # an unused new residual costs no read of a zero gradient


def _grads(ctx, dy, dres_out, through_ops: bool) -> tuple:
    """Gradients of the 14 op inputs; the backward kernel runs through the custom ops when ``through_ops``."""
    z, weight, seed, mean, rstd = ctx.saved_tensors
    o = ctx.options
    needs = ctx.needs_input_grad  # (x, residual, weight, bias, ...)
    if dy is None:
        dy = torch.zeros(z.shape, dtype=ctx.y_dtype, device=z.device)
    if dy.stride(-1) != 1:
        dy = dy.contiguous()
    if not ctx.has_res:
        dres_out = None  # the placeholder (0,) output has no gradient to add
    if dres_out is not None and dres_out.stride(-1) != 1:
        dres_out = dres_out.contiguous()
    # dresidual equals dx (same values) unless dropout sits between them or the dtypes differ: then reuse dx.
    separate_dres = ctx.has_res and (o["dropout_p"] > 0 or ctx.res_dtype != ctx.x_dtype)
    args = (
        dy,
        dres_out,
        z,
        weight,
        seed,
        mean,
        rstd,
        o["is_rms"],
        o["zero_centered"],
        o["round_mode"],
        o["dropout_p"],
        not ctx.has_res,
        ctx.x_dtype,
        ctx.res_dtype if separate_dres else None,
        weight is not None and needs[2],
        ctx.bias_dtype is not None and needs[3],
        o["max_block_n"],
    )
    if ctx.inplace_backward and dy.dtype == ctx.x_dtype and dy.is_contiguous():
        if through_ops:
            dres, dw, db = ops.norm_bwd_inplace(*args)
        else:
            _, dres, dw, db = ops.bwd_impl(*args, dx_out=dy)
        dx = dy
    else:
        dx, dres, dw, db = (ops.norm_bwd if through_ops else ops.bwd_impl)(*args)
    dresidual = (dres if separate_dres else dx) if ctx.has_res and needs[1] else None
    dweight = dw.to(weight.dtype) if weight is not None and needs[2] else None
    dbias = db.to(ctx.bias_dtype) if ctx.bias_dtype is not None and needs[3] else None
    return (dx if needs[0] else None, dresidual, dweight, dbias) + (None,) * 10


def _op_backward(ctx, dy, dres_out, _dmean, _drstd):
    return _grads(ctx, dy, dres_out, through_ops=True)


torch.library.register_autograd("lnblocks::norm_fwd", _op_backward, setup_context=_setup_context)


class FusedAddNormFunction(torch.autograd.Function):
    """Eager autograd of the fused norm: takes the 14 arguments of ``lnblocks::norm_fwd``, returns ``(y, new_res)``."""

    @staticmethod
    def forward(ctx, *inputs):
        output = ops.fwd_impl(*inputs)
        _setup_context(ctx, inputs, output)
        return output[0], output[1]

    @staticmethod
    def backward(ctx, dy, dres_out):
        return _grads(ctx, dy, dres_out, through_ops=False)
