"""The one autograd and custom-op layer of the fused norm: ``torch.library`` ops, fake impls, and their autograd.

- ``lnblocks::norm_fwd(x, residual?, weight?, bias?, seed?, <plan>) -> (y, new_residual, mean, rstd)``
- ``lnblocks::norm_bwd(dy, dres_out?, z, weight?, seed?, mean, rstd, compute_dw, compute_db, <plan>)
  -> (dx, dresidual, dweight, dbias)``
- ``lnblocks::norm_bwd_inplace``: the same, dx written into ``dy`` (opt-in; Liger's default, which corrupts models
  that reuse ``dy``, Liger#370); returns ``(dresidual, dweight, dbias)``.

``<plan>`` is ``NormPlan``'s fields, generated from the dataclass (``plan.schema_args``): the argument list is
written once. Ops take 2-D ``(M, N)`` operands and return fresh tensors (absent outputs are empty tensors).
Opaque custom ops are what lets ``torch.compile(fullgraph=True)`` trace the kernels without a graph break
(FakeTensor tracing broke flash-attn's Triton RMSNorm, pytorch#121526; quack#18). Eager calls go through
``FusedNorm`` (an ``autograd.Function`` with the same context and backward) and skip the op dispatcher's per-call
overhead.

Saved for the backward: the norm's input (the new residual, or x without a residual: no extra copy), the weight,
the dropout seed and fp32 mean/rstd; x_hat and the dropout mask are recomputed (flash-attn's scheme). When a graph of
the gradient is being built (``create_graph=True``: gradient penalties, Hessian-vector products) the backward runs
the differentiable reference math of ``lnblocks.norms.functional`` instead of the kernel, so double backward gives
the torch backend's result rather than a silently detached gradient.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from lnblocks.kernels.launch import launch_backward, launch_forward, launch_keep_mask
from lnblocks.kernels.plan import NormPlan, plan_from_op_args, schema_args
from lnblocks.norms import functional as LF

_PLAN = schema_args()
_FWD_TENSORS = "Tensor x, Tensor? residual, Tensor? weight, Tensor? bias, Tensor? seed"
_BWD_TENSORS = "Tensor? dres_out, Tensor z, Tensor? weight, Tensor? seed, Tensor mean, Tensor rstd"
_BWD_FLAGS = "bool compute_dw, bool compute_db"
_N_FWD_TENSORS = 5


# ---- custom ops ------------------------------------------------------------------------------------------------------
def _fwd_op_impl(x, residual, weight, bias, seed, *plan_args):
    return launch_forward(plan_from_op_args(*plan_args), x, residual, weight, bias, seed)


def _fwd_op_fake(x, residual, weight, bias, seed, *plan_args):
    plan = plan_from_op_args(*plan_args)
    m, n = x.shape
    y = x.new_empty((m, n), dtype=plan.out_dtype)
    res = x.new_empty((m, n) if residual is not None else (0,), dtype=plan.norm_dtype)
    mean = x.new_empty((0,) if plan.is_rms else (m,), dtype=torch.float32)
    rstd = x.new_empty((m,), dtype=torch.float32)
    return y, res, mean, rstd


def _bwd_op_impl(dy, dres_out, z, weight, seed, mean, rstd, compute_dw, compute_db, *plan_args):
    plan = plan_from_op_args(*plan_args)
    return launch_backward(plan, dy, dres_out, z, weight, seed, mean, rstd, compute_dw, compute_db)


def _bwd_op_inplace_impl(dy, dres_out, z, weight, seed, mean, rstd, compute_dw, compute_db, *plan_args):
    plan = plan_from_op_args(*plan_args)
    _, dres, dw, db = launch_backward(plan, dy, dres_out, z, weight, seed, mean, rstd, compute_dw, compute_db, dy)
    return dres, dw, db


def _bwd_fake_grads(z, plan: NormPlan, compute_dw: bool, compute_db: bool):
    m, n = z.shape
    separate = plan.separate_dresidual
    dres = z.new_empty((m, n) if separate else (0,), dtype=plan.residual_dtype if separate else plan.x_dtype)
    dw = z.new_empty((n,) if compute_dw else (0,), dtype=torch.float32)
    db = z.new_empty((n,) if compute_db else (0,), dtype=torch.float32)
    return dres, dw, db


def _bwd_op_fake(dy, dres_out, z, weight, seed, mean, rstd, compute_dw, compute_db, *plan_args):
    plan = plan_from_op_args(*plan_args)
    return (z.new_empty(z.shape, dtype=plan.x_dtype), *_bwd_fake_grads(z, plan, compute_dw, compute_db))


def _bwd_op_inplace_fake(dy, dres_out, z, weight, seed, mean, rstd, compute_dw, compute_db, *plan_args):
    return _bwd_fake_grads(z, plan_from_op_args(*plan_args), compute_dw, compute_db)


def _custom_op(
    name: str, impl: Callable, fake: Callable, schema: str, mutates_args: tuple[str, ...] = ()
) -> torch.library.CustomOpDef:
    """The ``torch.library`` op ``name`` running ``impl``, with ``fake`` registered for tracing."""
    op = torch.library.custom_op(name, impl, mutates_args=mutates_args, schema=schema)
    op.register_fake(fake)
    return op


norm_fwd = _custom_op(
    "lnblocks::norm_fwd", _fwd_op_impl, _fwd_op_fake, f"({_FWD_TENSORS}, {_PLAN}) -> (Tensor, Tensor, Tensor, Tensor)"
)
norm_bwd = _custom_op(
    "lnblocks::norm_bwd",
    _bwd_op_impl,
    _bwd_op_fake,
    f"(Tensor dy, {_BWD_TENSORS}, {_BWD_FLAGS}, {_PLAN}) -> (Tensor, Tensor, Tensor, Tensor)",
)
norm_bwd_inplace = _custom_op(
    "lnblocks::norm_bwd_inplace",
    _bwd_op_inplace_impl,
    _bwd_op_inplace_fake,
    f"(Tensor(a!) dy, {_BWD_TENSORS}, {_BWD_FLAGS}, {_PLAN}) -> (Tensor, Tensor, Tensor)",
    mutates_args=("dy",),
)


# ---- autograd ----------------------------------------------------------------------------------------------------
def _save(ctx, plan: NormPlan, x, residual, weight, bias, seed, outputs) -> None:
    _y, new_residual, mean, rstd = outputs
    ctx.save_for_backward(new_residual if residual is not None else x, weight, seed, mean, rstd)
    ctx.plan = plan
    ctx.bias_dtype = None if bias is None else bias.dtype  # dbias needs no bias value: it is dy summed over rows
    ctx.set_materialize_grads(False)  # an unused new residual costs no read of a zero gradient


def _backward(ctx, dy: Tensor | None, dres_out: Tensor | None, through_ops: bool) -> tuple:
    """Gradients of ``(x, residual, weight, bias)``; the kernel runs through the custom ops when ``through_ops``."""
    plan: NormPlan = ctx.plan
    needs = ctx.needs_input_grad  # (x, residual, weight, bias, ...)
    if torch.is_grad_enabled():  # create_graph=True: build the gradient's graph through the reference math
        return _reference_backward(ctx, plan, dy, dres_out, needs)
    z, weight, seed, mean, rstd = ctx.saved_tensors
    if dy is None:
        dy = torch.zeros(z.shape, dtype=plan.out_dtype, device=z.device)
    if dy.stride(-1) != 1:
        dy = dy.contiguous()
    if not plan.has_residual:
        dres_out = None  # the placeholder (0,) output has no gradient to add
    if dres_out is not None and dres_out.stride(-1) != 1:
        dres_out = dres_out.contiguous()
    compute_dw = weight is not None and needs[2]
    compute_db = ctx.bias_dtype is not None and needs[3]
    tensors = (dres_out, z, weight, seed, mean, rstd, compute_dw, compute_db)
    if plan.inplace_backward and dy.dtype == plan.x_dtype and dy.is_contiguous():
        if through_ops:
            dres, dw, db = norm_bwd_inplace(dy, *tensors, *plan.op_args())
        else:
            _, dres, dw, db = launch_backward(plan, dy, *tensors, dx_out=dy)
        dx = dy
    elif through_ops:
        dx, dres, dw, db = norm_bwd(dy, *tensors, *plan.op_args())
    else:
        dx, dres, dw, db = launch_backward(plan, dy, *tensors)
    dresidual = (dres if plan.separate_dresidual else dx) if plan.has_residual and needs[1] else None
    return (
        dx if needs[0] else None,
        dresidual,
        dw.to(weight.dtype) if compute_dw else None,
        db.to(ctx.bias_dtype) if compute_db else None,
    )


def _reference_backward(ctx, plan: NormPlan, dy, dres_out, needs) -> tuple:
    """The backward as differentiable torch ops (the eager math of ``lnblocks.norms.functional``), for double backward.

    The saved norm input ``z`` (x, or the new residual, an output of this node) keeps its graph, so second-order
    terms flow back to x, residual, weight and bias exactly as through the torch backend.
    """
    z, weight, seed, _mean, _rstd = ctx.saved_tensors
    scale = 1.0 / (1.0 - plan.dropout_p)
    keep = launch_keep_mask(seed, *z.shape, plan.dropout_p, z.device) if plan.dropout_p > 0 else None
    h = z if plan.has_residual or keep is None else z * keep * scale  # the tensor the norm saw: dropout(x) or z
    shape = (z.shape[-1],)
    if plan.is_rms:
        y = LF.rms_norm(h, shape, weight, plan.eps, plan.cast, plan.zero_centered)
    else:
        y = LF.layer_norm(h, shape, weight, None, plan.eps, plan.zero_centered)  # y's gradients do not involve b
    y = y.to(plan.out_dtype)
    operands = ((z, needs[0] or needs[1]), (weight, needs[2]))
    wanted = [t for t, need in operands if need and t is not None and t.requires_grad]
    dz = dw = db = None
    if dy is not None and wanted:
        got = torch.autograd.grad(y, wanted, dy.to(y.dtype), create_graph=True, allow_unused=True)
        by_id = {id(t): g for t, g in zip(wanted, got)}
        dz, dw = (None if t is None else by_id.get(id(t)) for t in (z, weight))
    if dy is not None and ctx.bias_dtype is not None and needs[3]:
        db = dy.to(torch.float32).sum(0).to(ctx.bias_dtype)
    if not plan.has_residual:  # z is x: dz already went through the dropout mask
        return (dz.to(plan.x_dtype) if dz is not None and needs[0] else None), None, dw, db
    if dres_out is not None:
        dz = dres_out if dz is None else dz + dres_out
    if dz is None:
        return None, None, dw, db
    dresidual = dz.to(plan.residual_dtype) if needs[1] else None
    dx = (dz * keep * scale if keep is not None else dz).to(plan.x_dtype) if needs[0] else None
    return dx, dresidual, dw, db


def _op_setup_context(ctx, inputs, output) -> None:
    x, residual, weight, bias, seed = inputs[:_N_FWD_TENSORS]
    _save(ctx, plan_from_op_args(*inputs[_N_FWD_TENSORS:]), x, residual, weight, bias, seed, output)


def _op_backward(ctx, dy, dres_out, _dmean, _drstd):
    grads = _backward(ctx, dy, dres_out, through_ops=True)
    return grads + (None,) * (len(ctx.needs_input_grad) - len(grads))


torch.library.register_autograd("lnblocks::norm_fwd", _op_backward, setup_context=_op_setup_context)


def _ready(t: Tensor | None) -> Tensor | None:
    """``t`` itself, or, for the local tensor of a DTensor whose collective is still in flight (an
    ``AsyncCollectiveTensor``: what a reduce-scatter into ``SequenceParallel`` leaves), the waited plain tensor: the
    kernels read data pointers, which the wrapper does not have. The custom op route gets this from the dispatcher."""
    wait = getattr(t, "trigger_wait", None)
    return t if wait is None else wait()


class FusedNorm(torch.autograd.Function):
    """Eager autograd of the fused norm: ``(x, residual, weight, bias, seed, plan) -> (y, new_residual)``."""

    @staticmethod
    def forward(ctx, x, residual, weight, bias, seed, plan: NormPlan):
        x, residual, weight, bias = _ready(x), _ready(residual), _ready(weight), _ready(bias)
        outputs = launch_forward(plan, x, residual, weight, bias, seed)
        _save(ctx, plan, x, residual, weight, bias, seed, outputs)
        return outputs[0], outputs[1]

    @staticmethod
    def backward(ctx, dy, dres_out):
        return (*_backward(ctx, _ready(dy), _ready(dres_out), through_ops=False), None, None)
