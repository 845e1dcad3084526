"""The one autograd and custom-op layer of the fused norm: ``torch.library`` ops, fake impls, and their autograd.

- ``lnblocks::norm_fwd(x, residual?, weight?, bias?, seed?, gate?, alpha?, shift?, <plan>)
  -> (y, new_residual, mean, rstd)``
- ``lnblocks::norm_bwd(dy, dres_out?, z, weight?, bias?, seed?, mean, rstd, gate?, alpha?, shift?, <flags>, <plan>)
  -> (dx, dresidual, dweight, dbias, dgate, dalpha, dshift)``
- ``lnblocks::norm_bwd_inplace``: the same, dx written into ``dy`` (opt-in; Liger's default, which corrupts models
  that reuse ``dy``, Liger#370); returns the six others.

``<plan>`` is ``NormPlan``'s fields, generated from the dataclass (``plan.schema_args``): the argument list is
written once. Ops take 2-D ``(M, N)`` operands and return fresh tensors (absent outputs are empty tensors).
Opaque custom ops are what lets ``torch.compile(fullgraph=True)`` trace the kernels without a graph break
(FakeTensor tracing broke flash-attn's Triton RMSNorm, pytorch#121526; quack#18). Eager calls go through
``FusedNorm`` (an ``autograd.Function`` with the same context and backward) and skip the op dispatcher's per-call
overhead.

Saved for the backward: the norm's input (the new residual, or x without a residual: no extra copy), the weight,
the gate, DyT/Derf's scalars, the dropout seed and fp32 mean/rstd; x_hat and the dropout mask are recomputed
(flash-attn's scheme). ``plan.memory_efficient``: the output y instead of the input (and the bias, no mean): the
backward rebuilds x_hat from it (Apex's ``memory_efficient``), so the norm's input can be freed when the next layer
keeps y anyway. When a graph of the gradient is being built (``create_graph=True``: gradient penalties,
Hessian-vector products) the backward runs the differentiable reference math of ``lnblocks.norms.functional``
instead of the kernel, so double backward gives the torch backend's result rather than a silently detached gradient.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from lnblocks.kernels.launch import Grads, groups_of, launch_backward, launch_forward, launch_keep_mask
from lnblocks.kernels.plan import NormPlan, plan_from_op_args, schema_args
from lnblocks.norms import functional as LF

_PLAN = schema_args()
_FWD_TENSORS = "Tensor x, Tensor? residual, Tensor? weight, Tensor? bias, Tensor? seed, Tensor? gate, Tensor? alpha, " \
    "Tensor? shift"  # fmt: skip
_BWD_TENSORS = "Tensor? dres_out, Tensor z, Tensor? weight, Tensor? bias, Tensor? seed, Tensor mean, Tensor rstd, " \
    "Tensor? gate, Tensor? alpha, Tensor? shift"  # fmt: skip
_BWD_FLAGS = "bool compute_dw, bool compute_db, bool compute_dgate, bool compute_dscalars"
_N_FWD_TENSORS = 8
_SEVEN = "(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)"


# ---- custom ops ------------------------------------------------------------------------------------------------------
def _fwd_op_impl(x, residual, weight, bias, seed, gate, alpha, shift, *plan_args):
    plan = plan_from_op_args(*plan_args)
    return launch_forward(plan, x, residual, weight, bias, seed, gate=gate, alpha=alpha, shift=shift)


def _fwd_op_fake(x, residual, weight, bias, seed, gate, alpha, shift, *plan_args):
    plan = plan_from_op_args(*plan_args)
    m, n = x.shape
    stats = 0 if plan.pointwise else m * groups_of(plan, n)[0]
    y = x.new_empty((m, n) if plan.write_y else (0,), dtype=plan.out_dtype)
    res = x.new_empty((m, n) if residual is not None else (0,), dtype=plan.stream_dtype)
    mean = x.new_empty((0,) if plan.is_rms else (stats,), dtype=torch.float32)
    rstd = x.new_empty((stats,), dtype=torch.float32)
    return y, res, mean, rstd


def _run_bwd(dy, dres_out, z, weight, bias, seed, mean, rstd, gate, alpha, shift, flags, plan_args, dx_out=None):
    plan = plan_from_op_args(*plan_args)
    compute_dw, compute_db, compute_dgate, compute_dscalars = flags
    return launch_backward(
        plan, dy, dres_out, z, weight, seed, mean, rstd, compute_dw, compute_db, dx_out, bias=bias, gate=gate,
        alpha=alpha, shift=shift, compute_dgate=compute_dgate, compute_dscalars=compute_dscalars,
    )  # fmt: skip


def _bwd_op_impl(dy, dres_out, z, weight, bias, seed, mean, rstd, gate, alpha, shift, f1, f2, f3, f4, *plan_args):
    return tuple(_run_bwd(dy, dres_out, z, weight, bias, seed, mean, rstd, gate, alpha, shift, (f1, f2, f3, f4),
                          plan_args))  # fmt: skip


def _bwd_op_inplace_impl(dy, dres_out, z, weight, bias, seed, mean, rstd, gate, alpha, shift, f1, f2, f3, f4,
                         *plan_args):  # fmt: skip
    grads = _run_bwd(dy, dres_out, z, weight, bias, seed, mean, rstd, gate, alpha, shift, (f1, f2, f3, f4),
                     plan_args, dx_out=dy)  # fmt: skip
    return tuple(grads[1:])


def _bwd_fake_grads(z, gate, plan: NormPlan, flags) -> tuple:
    compute_dw, compute_db, compute_dgate, compute_dscalars = flags
    m, n = z.shape
    separate = plan.separate_dresidual
    dres = z.new_empty((m, n) if separate else (0,), dtype=plan.residual_dtype if separate else plan.x_dtype)
    dw = z.new_empty((n,) if compute_dw else (0,), dtype=torch.float32)
    db = z.new_empty((n,) if compute_db else (0,), dtype=torch.float32)
    dgate = z.new_empty((m, n) if compute_dgate else (0,), dtype=gate.dtype if gate is not None else plan.x_dtype)
    da = z.new_empty((1,) if compute_dscalars else (0,), dtype=torch.float32)
    ds = z.new_empty((1,) if compute_dscalars and plan.pointwise == 2 else (0,), dtype=torch.float32)
    return dres, dw, db, dgate, da, ds


def _bwd_op_fake(dy, dres_out, z, weight, bias, seed, mean, rstd, gate, alpha, shift, f1, f2, f3, f4, *plan_args):
    plan = plan_from_op_args(*plan_args)
    dx = z.new_empty(z.shape, dtype=plan.x_dtype)
    return (dx, *_bwd_fake_grads(z, gate, plan, (f1, f2, f3, f4)))


def _bwd_op_inplace_fake(dy, dres_out, z, weight, bias, seed, mean, rstd, gate, alpha, shift, f1, f2, f3, f4,
                         *plan_args):  # fmt: skip
    return _bwd_fake_grads(z, gate, plan_from_op_args(*plan_args), (f1, f2, f3, f4))


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
    "lnblocks::norm_bwd", _bwd_op_impl, _bwd_op_fake, f"(Tensor dy, {_BWD_TENSORS}, {_BWD_FLAGS}, {_PLAN}) -> {_SEVEN}"
)
norm_bwd_inplace = _custom_op(
    "lnblocks::norm_bwd_inplace",
    _bwd_op_inplace_impl,
    _bwd_op_inplace_fake,
    f"(Tensor(a!) dy, {_BWD_TENSORS}, {_BWD_FLAGS}, {_PLAN}) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
    mutates_args=("dy",),
)


# ---- autograd ----------------------------------------------------------------------------------------------------
def _save(ctx, plan: NormPlan, inputs: tuple, outputs) -> None:
    x, residual, weight, bias, seed, gate, alpha, shift = inputs
    y, new_residual, mean, rstd = outputs
    if plan.memory_efficient:  # the output, not the input: x_hat is rebuilt as (y - b) / w
        ctx.save_for_backward(y, weight, bias, seed, None, rstd, gate, alpha, shift)  # (no mean: x_hat needs none)
    else:
        z = new_residual if residual is not None and not plan.norm_then_add else x
        ctx.save_for_backward(z, weight, None, seed, mean, rstd, gate, alpha, shift)
    ctx.plan = plan
    ctx.bias_dtype = None if bias is None else bias.dtype  # dbias needs no bias value: it is dy summed over rows
    ctx.set_materialize_grads(False)  # an unused new residual costs no read of a zero gradient


def _backward(ctx, dy: Tensor | None, dres_out: Tensor | None, through_ops: bool) -> tuple:
    """Gradients of ``(x, residual, weight, bias, seed, gate, alpha, shift)``; through the custom ops when
    ``through_ops``."""
    plan: NormPlan = ctx.plan
    needs = ctx.needs_input_grad  # (x, residual, weight, bias, seed, gate, alpha, shift, ...)
    if torch.is_grad_enabled():  # create_graph=True: build the gradient's graph through the reference math
        return _reference_backward(ctx, plan, dy, dres_out, needs)
    z, weight, bias, seed, mean, rstd, gate, alpha, shift = ctx.saved_tensors
    if mean is None:
        mean = rstd.new_empty((0,))
    if not plan.has_residual:
        dres_out = None  # the placeholder (0,) output has no gradient to add
    if dy is None:  # norm-then-add reads the new residual's gradient; otherwise an unused y has a zero gradient
        dy = z.new_empty((0,)) if plan.norm_then_add else torch.zeros(z.shape, dtype=plan.out_dtype, device=z.device)
    dy, dres_out = (t if t is None or t.numel() == 0 or t.stride(-1) == 1 else t.contiguous() for t in (dy, dres_out))
    flags = (
        weight is not None and needs[2],
        ctx.bias_dtype is not None and needs[3],
        gate is not None and needs[5],
        alpha is not None and (needs[6] or needs[7]),
    )
    tensors = (dres_out, z, weight, bias, seed, mean, rstd, gate, alpha, shift, *flags)
    inplace = plan.inplace_backward and dy.dtype == plan.x_dtype and dy.is_contiguous() and dy.numel() > 0
    if inplace:
        if through_ops:
            grads = Grads(dy, *norm_bwd_inplace(dy, *tensors, *plan.op_args()))
        else:
            grads = _run_bwd(dy, *tensors[:-4], flags, plan.op_args(), dx_out=dy)
    elif through_ops:
        grads = Grads(*norm_bwd(dy, *tensors, *plan.op_args()))
    else:
        grads = _run_bwd(dy, *tensors[:-4], flags, plan.op_args())
    return _grads_of_inputs(ctx, plan, grads, dres_out, flags, needs)


def _grads_of_inputs(ctx, plan: NormPlan, grads: Grads, dres_out, flags, needs) -> tuple:
    compute_dw, compute_db, compute_dgate, compute_dscalars = flags
    _, weight, _, _, _, _, _, alpha, shift = ctx.saved_tensors
    dresidual = None
    if plan.has_residual and needs[1]:
        if plan.norm_then_add:  # `residual + y`: the residual's gradient is the new residual's
            dresidual = None if dres_out is None else dres_out.to(plan.residual_dtype)
        else:
            dresidual = grads.dresidual if plan.separate_dresidual else grads.dx
    return (
        grads.dx if needs[0] else None,
        dresidual,
        grads.dweight.to(weight.dtype) if compute_dw else None,
        grads.dbias.to(ctx.bias_dtype) if compute_db else None,
        None,
        grads.dgate if compute_dgate else None,
        grads.dalpha.to(alpha.dtype) if compute_dscalars and needs[6] else None,
        grads.dshift.to(shift.dtype) if compute_dscalars and needs[7] and shift is not None else None,
    )


def reference_forward(plan: NormPlan, h: Tensor, weight, bias, gate, alpha, shift) -> Tensor:
    """``y = norm(h)`` through the differentiable reference math of ``lnblocks.norms.functional``."""
    n = h.shape[-1]
    group = plan.group_size or None
    shape = (n,)
    if plan.kind == "layernorm":
        return LF._layer_norm(h, shape, weight, bias, plan.eps, plan.zero_centered, plan.cast, group)
    if plan.kind == "rmsnorm":
        return LF._rms_norm(h, shape, weight, plan.eps, plan.cast, plan.zero_centered, group)
    if plan.kind == "l2norm":
        return LF._l2_norm(h, shape, plan.eps, "sum" if plan.l2_sum else "mean")
    if plan.kind == "gated_rmsnorm":
        position = "before" if plan.gate_position == "none" else plan.gate_position
        return LF._gated_rms_norm(h, gate, shape, weight, plan.eps, position, plan.activation, plan.cast, group)
    if plan.kind == "dyt":
        return LF._dyt(h, alpha, weight, bias)
    return LF._derf(h, alpha, shift, weight, bias)


def _reference_backward(ctx, plan: NormPlan, dy, dres_out, needs) -> tuple:
    """The backward as differentiable torch ops (the eager math of ``lnblocks.norms.functional``), for double backward.

    The saved norm input ``z`` (x, or the new residual, an output of this node) keeps its graph, so second-order
    terms flow back to x, residual and the parameters exactly as through the torch backend. Not for the
    memory-efficient backward, whose saved tensor is y (refused when the plan is made with a graph being built).
    """
    z, weight, _, seed, _mean, _rstd, gate, alpha, shift = ctx.saved_tensors
    if plan.memory_efficient:
        raise RuntimeError("memory_efficient=True has no double backward: it saved y, not the norm's input")
    scale = 1.0 / (1.0 - plan.dropout_p)
    keep = launch_keep_mask(seed, *z.shape, plan.dropout_p, z.device) if plan.dropout_p > 0 else None
    first = not plan.has_residual or plan.norm_then_add  # z is x itself
    h = z * keep * scale if first and keep is not None else z  # the tensor the norm saw: dropout(x) or z
    y = reference_forward(plan, h, weight, None, gate, alpha, shift)  # y's gradients do not involve b: it is added
    y = y.to(plan.out_dtype)
    operands = ((z, needs[0] or needs[1]), (weight, needs[2]), (gate, needs[5]), (alpha, needs[6]), (shift, needs[7]))
    wanted = [t for t, need in operands if need and t is not None and t.requires_grad]
    grad_y = dy
    if plan.norm_then_add and dres_out is not None:
        grad_y = dres_out.to(y.dtype) if dy is None else dy + dres_out.to(y.dtype)
    by_id = {}
    if grad_y is not None and wanted:
        got = torch.autograd.grad(y, wanted, grad_y.to(y.dtype), create_graph=True, allow_unused=True)
        by_id = {id(t): g for t, g in zip(wanted, got)}
    dz, dw, dg, da, ds = (None if t is None else by_id.get(id(t)) for t, _ in operands)
    db = None
    if grad_y is not None and ctx.bias_dtype is not None and needs[3]:
        db = grad_y.to(torch.float32).sum(0).to(ctx.bias_dtype)
    if first:  # z is x: dz already went through the dropout mask
        dres = None
        if plan.norm_then_add and needs[1] and dres_out is not None:
            dres = dres_out.to(plan.residual_dtype)
        return (dz.to(plan.x_dtype) if dz is not None and needs[0] else None), dres, dw, db, None, dg, da, ds
    if dres_out is not None:
        dz = dres_out if dz is None else dz + dres_out
    if dz is None:
        return None, None, dw, db, None, dg, da, ds
    dresidual = dz.to(plan.residual_dtype) if needs[1] else None
    dx = (dz * keep * scale if keep is not None else dz).to(plan.x_dtype) if needs[0] else None
    return dx, dresidual, dw, db, None, dg, da, ds


def _op_setup_context(ctx, inputs, output) -> None:
    _save(ctx, plan_from_op_args(*inputs[_N_FWD_TENSORS:]), inputs[:_N_FWD_TENSORS], output)


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
    """Eager autograd of the fused norm: ``(x, residual, weight, bias, seed, gate, alpha, shift, plan) ->
    (y, new_residual)``."""

    @staticmethod
    def forward(ctx, x, residual, weight, bias, seed, gate, alpha, shift, plan: NormPlan):
        inputs = tuple(_ready(t) for t in (x, residual, weight, bias, seed, gate, alpha, shift))
        outputs = launch_forward(plan, *inputs[:5], gate=inputs[5], alpha=inputs[6], shift=inputs[7])
        _save(ctx, plan, inputs, outputs)
        return outputs[0], outputs[1]

    @staticmethod
    def backward(ctx, dy, dres_out):
        return (*_backward(ctx, _ready(dy), _ready(dres_out), through_ops=False), None)
