"""The hot path of the fused kernels: ``run_fused`` runs a planned call on operands a caller already validated.

A module's cached call reaches the kernel in four hops: ``lnblocks.norms.routing.dispatch`` -> ``run_fused`` ->
``FusedNorm`` (or the ``lnblocks::norm_fwd`` custom op while compiling) -> ``launch_forward`` -> the Triton kernel.
DTensor operands (tensor/sequence parallelism) run the same kernels on each rank's local rows (``_run_sharded``).
Also here: what a call checks that a plan cannot vouch for (parameters changed in place, the memory-efficient
backward's rule for the weight, operands the kernels cannot read), and Nemotron's autocast rule.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from lnblocks.kernels.ops import FusedNorm, norm_fwd
from lnblocks.kernels.plan import (
    KERNEL_DTYPES,
    NormPlan,
    device_unavailable_reason,
    is_dtensor,
    sharding_unavailable_reason,
    without_gate,
)
from lnblocks.norms import functional as LF


def operand_unavailable_reason(name: str, t: Tensor | None) -> str | None:
    """Why the kernels cannot read ``t`` (a residual or gate met at call time), or None."""
    if t is None:
        return None
    reason = device_unavailable_reason(t, name)
    if reason is None and t.dtype not in KERNEL_DTYPES:
        reason = f"{name} is {t.dtype}; the kernels take float16, bfloat16 or float32"
    return reason


def gate_unavailable_reason(gate: Tensor | None, x: Tensor) -> str | None:
    """Why the gated kernel cannot take this gate with ``x`` (DTensor-ness must match), or None."""
    reason = operand_unavailable_reason("gate", gate)
    if reason is None and gate is not None and is_dtensor(gate) != is_dtensor(x):
        reason = "gate and x must both be DTensors or both plain tensors"
    return reason


class StaleOperandError(ValueError):
    """An operand no longer has the shape, dtype or device its call was planned for (a parameter changed in place,
    e.g. ``weight.data = ...``); a module re-plans once on it, a second failure reaches the caller."""


def run_fused(
    plan: NormPlan,
    x: Tensor,
    residual: Tensor | None,
    weight: Tensor | None,
    bias: Tensor | None,
    n: int,
    others: tuple[tuple[str, Tensor], ...] = (),
    seed: Tensor | None = None,
    *,
    gate: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """Run a planned call on validated operands (x: ``(..., *normalized_shape)``, ``n`` elements per row).

    ``others``: the one-element parameters by name (DyT's and Derf's ``alpha``, Derf's ``shift``); ``gate``: the
    gated RMSNorm's gate, shaped like x. Returns ``y`` without a residual, else ``(y, new_residual)``, shaped like
    ``x`` (norm-then-add without ``write_y``: y is an empty tensor). What a cached plan cannot vouch for is checked on
    every call, because a kernel reading past a tensor's end or another device's memory would not fail, it would
    return garbage: the parameters' shape (``n`` elements), dtype (the planned one) and device, and the residual's
    device. A mismatch raises ``StaleOperandError`` before anything runs.
    """
    if weight is not None and (
        weight.dtype != plan.weight_dtype or weight.get_device() != x.get_device() or weight.numel() != n
    ):
        raise StaleOperandError(_changed("weight", weight, plan.weight_dtype, x, n))
    if bias is not None and (bias.get_device() != x.get_device() or bias.numel() != n):
        raise StaleOperandError(_changed("bias", bias, bias.dtype, x, n))
    if residual is not None and residual.get_device() != x.get_device():
        raise StaleOperandError(_changed("residual", residual, residual.dtype, x, None))
    alpha = shift = None
    if others:  # DyT's, Derf's scalars (the common norms have none: no work on their hot path)
        scalars = dict(others)
        alpha, shift = scalars.get("alpha"), scalars.get("shift")
        for name, t in (("alpha", alpha), ("shift", shift)):
            if t is not None and (t.get_device() != x.get_device() or t.numel() != 1):
                raise StaleOperandError(_changed(name, t, t.dtype, x, 1))
    if gate is None and plan.gate_position != "none":
        plan = without_gate(plan)
    if plan.cast == "nemotron" and torch.is_autocast_enabled():
        return _run_nemotron_autocast(plan, x, residual, weight, bias, n, seed)
    if type(x) is not Tensor and is_dtensor(x):
        return _run_sharded(plan, x, residual, weight, bias, n, seed, gate, alpha, shift)
    return _run_local(plan, x, residual, weight, bias, n, seed, gate, alpha, shift)


def _run_local(plan, x, residual, weight, bias, n, seed, gate, alpha, shift):
    x2 = _as_rows(x, n)
    r2 = None if residual is None else _as_rows(residual, n)
    g2 = None if gate is None else _as_rows(gate, n)
    w = None if weight is None else weight.reshape(-1).contiguous()
    b = None if bias is None else bias.reshape(-1).contiguous()
    a, s = (None if t is None else t.reshape(1) for t in (alpha, shift))
    if plan.memory_efficient and torch.is_grad_enabled() and _any_requires_grad(x, residual, weight, bias):
        check_rebuildable(plan, weight, bias)  # (the parameters themselves: their versions key the check)
    if torch.compiler.is_compiling():  # an opaque custom op: no graph break
        y, new_residual, _mean, _rstd = norm_fwd(x2, r2, w, b, seed, g2, a, s, *plan.op_args())
    else:  # eager: the same kernels without the op dispatcher's per-call overhead
        y, new_residual = FusedNorm.apply(x2, r2, w, b, seed, g2, a, s, plan)
    y = y.view(x.shape) if plan.write_y else y
    return y if residual is None else (y, new_residual.view(x.shape))


def _any_requires_grad(*tensors: Tensor | None) -> bool:
    return any(t is not None and t.requires_grad for t in tensors)


def _run_nemotron_autocast(plan, x, residual, weight, bias, n, seed):
    """``NemotronLayerNorm1P`` under CUDA autocast: the norm's input, ``1 + w`` (added in the weight's dtype) and the
    bias go to the autocast dtype as torch ops (their gradients flow through the casts as in the class), then the
    plain LayerNorm kernel runs on them. A residual added before the norm is added first, outside the rule."""
    if residual is not None and not plan.norm_then_add:
        new_residual = LF._add_residual(x, residual, plan.residual_in_fp32)
        plan = dataclasses.replace(plan, residual_dtype=None, x_dtype=new_residual.dtype)
        return _run_nemotron_autocast(plan, new_residual, None, weight, bias, n, seed), new_residual
    target = torch.get_autocast_dtype(x.device.type)
    if weight is not None and plan.zero_centered:
        weight = weight + 1.0
    x, weight, bias = (None if t is None else LF._autocast_cast(t, t.device.type, target) for t in (x, weight, bias))
    plan = dataclasses.replace(
        plan, cast="fp32", zero_centered=False, x_dtype=x.dtype, out_dtype=x.dtype,
        weight_dtype=None if weight is None else weight.dtype,
    )  # fmt: skip
    return run_fused(plan, x, residual, weight, bias, n, seed=seed)


# ---- the memory-efficient backward's rule ------------------------------------------------------------------------
# It rebuilds x_hat = (y - b) / w from the saved output y, which is rounded: the rebuilt x_hat is off by y's rounding
# times (|y| + |b|) / |w|. Below MIN_WEIGHT an fp16 y = w * x_hat is subnormal (bits lost, 1/w huge); and with a bias
# the error grows like |b| / |w| (a weight near zero next to a sizeable bias): past MAX_BIAS_RATIO the rebuilt x_hat
# can be off by more than ~16 ulps of y's dtype. Either is refused, naming the element.
MIN_WEIGHT = 2.0**-14
MAX_BIAS_RATIO = 8.0
_CHECKED = "_lnblocks_rebuildable_versions"  # attribute of a weight: the (weight, bias) versions last found fine


def check_rebuildable(plan: NormPlan, weight: Tensor | None, bias: Tensor | None) -> None:
    """Refuse (``ValueError``) a memory-efficient call whose weight cannot give back x_hat from y (see above).

    Checked when the weight or the bias changed since the last check (their storage and ``_version``: once per
    optimizer step, never per micro-batch, never in frozen-norm fine-tuning). On CUDA (and while compiling) the check is
    ``torch._assert_async``: no host sync, a failure stops the run at the next sync with the message below; on CPU
    it raises a ``ValueError`` naming the element at once.
    """
    if weight is None:  # x_hat = y (l2norm, RMSNorm without a weight): always exact to y's rounding
        return
    compiling = torch.compiler.is_compiling()
    versions = tuple(None if t is None else (t.data_ptr(), t._version) for t in (weight, bias))
    if not compiling and getattr(weight, _CHECKED, None) == versions:
        return
    w = weight.detach().reshape(-1).float()
    if plan.zero_centered:
        w = 1.0 + w
        if plan.cast == "nemotron":
            w = w.to(weight.dtype).float()
    limit = torch.full_like(w, MIN_WEIGHT)
    if bias is not None:
        limit = torch.maximum(limit, bias.detach().reshape(-1).float().abs() / MAX_BIAS_RATIO)
    ok = w.abs() >= limit
    message = (
        f"memory_efficient=True: the backward rebuilds x_hat = (y - b) / w from the saved output, which needs every "
        f"|w| >= max({MIN_WEIGHT:g}, |b| / {MAX_BIAS_RATIO:g}) (the effective weight, 1 + w when zero-centred)"
    )
    if weight.is_cuda or compiling:  # no host sync (and nothing data-dependent for the compiler to trace)
        torch._assert_async(ok.all(), message)
    elif not bool(ok.all()):
        j = int((~ok).nonzero()[0, 0])
        b = "" if bias is None else f", bias {float(bias.detach().reshape(-1)[j]):.3g}"
        raise ValueError(f"{message}; element {j} has weight {float(w[j]):.3g}{b}. Use memory_efficient=False here.")
    if not compiling:
        setattr(weight, _CHECKED, versions)


def _changed(name: str, t: Tensor, planned: torch.dtype | None, x: Tensor, n: int | None) -> str:
    size = "" if n is None else f" with {n} elements,"
    return (
        f"{name}: expected {planned}{size} on {x.device} (what the call was planned for, the device of x), "
        f"got {t.dtype} of shape {tuple(t.shape)} on {t.device}"
    )


def _as_rows(t: Tensor, n: int) -> Tensor:
    """A (M, N) view of ``t`` with unit column stride (copied only when no such view exists)."""
    t2 = t.reshape(-1, n)
    return t2 if (t2.stride(-1) == 1 or n == 1) else t2.contiguous()


# ---- DTensor ---------------------------------------------------------------------------------------------------------
def _run_sharded(plan, x, residual, weight, bias, n, seed, gate, alpha, shift):
    """The kernels on each rank's local rows of a DTensor ``x`` (what ``local_map`` does, with uneven shards kept).

    A norm is row-wise: with ``x`` sharded on leading (batch/sequence) dims and the parameters replicated, every rank
    normalises its own rows, nothing is communicated in the forward, and the outputs keep ``x``'s placements. The
    local parameter gradients (weight, bias, DyT/Derf's scalars) are partial sums over the local rows: they come back
    ``Partial`` on the mesh dims that shard x (``Replicate`` on the others), and DTensor all-reduces them when they
    are used, as for ``torch.nn.LayerNorm`` under ``SequenceParallel``. A residual or gate in other placements is
    first redistributed to ``x``'s (from ``Replicate`` that is a local slice). What the kernels cannot do locally is
    refused (``sharding_unavailable_reason``), never gathered.
    """
    from torch.distributed.tensor import DTensor, Partial, Replicate

    params = (("weight", weight), ("bias", bias), ("gate", gate), ("alpha", alpha), ("shift", shift))
    reason = sharding_unavailable_reason(x, residual, params, n)
    if reason is None and plan.dropout_p > 0:
        reason = "dropout: the keep-mask is keyed by the local row index, which differs from the global one"
    if reason is not None:
        raise ValueError(f"the fused kernels cannot run this DTensor call: {reason}")
    mesh, placements = x.device_mesh, x.placements
    residual, gate = (t if t is None or t.placements == placements else t.redistribute(mesh, placements)
                      for t in (residual, gate))  # fmt: skip
    # a parameter's local gradient sums this rank's rows: a partial sum over every mesh dim that shards the rows
    grad = tuple(Partial() if p.is_shard() else Replicate() for p in placements)
    local = [None if t is None else t.to_local() for t in (x, residual, gate)]
    weight, bias, alpha, shift = (None if t is None else t.to_local(grad_placements=grad)
                                  for t in (weight, bias, alpha, shift))  # fmt: skip
    out = _run_local(plan, local[0], local[1], weight, bias, n, seed, local[2], alpha, shift)

    def wrap(t: Tensor, like: Tensor) -> DTensor:
        return DTensor.from_local(t, mesh, placements, run_check=False, shape=like.shape, stride=like.stride())

    if residual is None:
        return wrap(out, x)
    y, new_residual = out
    return (wrap(y, x) if plan.write_y else y), wrap(new_residual, x)
