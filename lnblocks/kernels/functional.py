"""Entry points of the fused kernels: ``fused_add_norm`` (validated public API), ``run_fused`` (the hot path, for
operands a caller already validated) and ``dropout_mask``.

A module's cached call reaches the kernel in four hops: ``lnblocks.norms.routing.dispatch`` -> ``run_fused`` ->
``FusedNorm`` (or the ``lnblocks::norm_fwd`` custom op while compiling) -> ``launch_forward`` -> the Triton kernel.
DTensor operands (tensor/sequence parallelism) run the same kernels on each rank's local rows (``_run_sharded``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from lnblocks.kernels.launch import launch_keep_mask
from lnblocks.kernels.ops import FusedNorm, norm_fwd
from lnblocks.kernels.plan import (
    KERNEL_DTYPES,
    NormPlan,
    device_unavailable_reason,
    is_dtensor,
    make_plan,
    sharding_unavailable_reason,
)
from lnblocks.norms.spec import NORM_PRESETS, LayerNormSpec, NormSpec, RMSNormSpec, norm_spec

_DTYPE_NAMES = "float16, bfloat16 or float32"
_DEFAULT_SPEC = LayerNormSpec()
_NAMED_SPECS = {"layernorm": _DEFAULT_SPEC, "rmsnorm": RMSNormSpec(), **NORM_PRESETS}


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
    seed: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """Run a planned call on validated operands (x: ``(..., *normalized_shape)``, ``n`` elements per row).

    Returns ``y`` without a residual, else ``(y, new_residual)``, shaped like ``x``. What a cached plan cannot vouch
    for is checked on every call, because a kernel reading past a tensor's end or another device's memory would not
    fail, it would return garbage: the parameters' shape (``n`` elements), dtype (the planned one) and device, and the
    residual's device. A mismatch raises ``StaleOperandError`` before anything runs.
    """
    if weight is not None and (
        weight.dtype != plan.weight_dtype or weight.get_device() != x.get_device() or weight.numel() != n
    ):
        raise StaleOperandError(_changed("weight", weight, plan.weight_dtype, x, n))
    if bias is not None and (bias.get_device() != x.get_device() or bias.numel() != n):
        raise StaleOperandError(_changed("bias", bias, bias.dtype, x, n))
    if residual is not None and residual.get_device() != x.get_device():
        raise StaleOperandError(_changed("residual", residual, residual.dtype, x, None))
    if type(x) is not Tensor and is_dtensor(x):
        return _run_sharded(plan, x, residual, weight, bias, n, seed)
    return _run_local(plan, x, residual, weight, bias, n, seed)


def _run_local(plan, x, residual, weight, bias, n, seed):
    x2 = _as_rows(x, n)
    r2 = None if residual is None else _as_rows(residual, n)
    w = None if weight is None else weight.reshape(-1).contiguous()
    b = None if bias is None else bias.reshape(-1).contiguous()
    if torch.compiler.is_compiling():  # an opaque custom op: no graph break
        y, new_residual, _mean, _rstd = norm_fwd(x2, r2, w, b, seed, *plan.op_args())
    else:  # eager: the same kernels without the op dispatcher's per-call overhead
        y, new_residual = FusedNorm.apply(x2, r2, w, b, seed, plan)
    y = y.view(x.shape)
    return y if residual is None else (y, new_residual.view(x.shape))


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
def _run_sharded(plan, x, residual, weight, bias, n, seed):
    """The kernels on each rank's local rows of a DTensor ``x`` (what ``local_map`` does, with uneven shards kept).

    A norm is row-wise: with ``x`` sharded on leading (batch/sequence) dims and the parameters replicated, every rank
    normalises its own rows, nothing is communicated in the forward, and the outputs keep ``x``'s placements. The
    local weight/bias gradients are partial sums over the local rows: they come back ``Partial`` on the mesh dims that
    shard x (``Replicate`` on the others), and DTensor all-reduces them when they are used, as for
    ``torch.nn.LayerNorm`` under ``SequenceParallel``. A residual in
    other placements is first redistributed to ``x``'s (from ``Replicate`` that is a local slice). What the kernels
    cannot do locally is refused (``sharding_unavailable_reason``), never gathered.
    """
    from torch.distributed.tensor import DTensor, Partial, Replicate

    reason = sharding_unavailable_reason(x, residual, (("weight", weight), ("bias", bias)), n)
    if reason is None and plan.dropout_p > 0:
        reason = "dropout: the keep-mask is keyed by the local row index, which differs from the global one"
    if reason is not None:
        raise ValueError(f"the fused kernels cannot run this DTensor call: {reason}")
    mesh, placements = x.device_mesh, x.placements
    if residual is not None and residual.placements != placements:
        residual = residual.redistribute(mesh, placements)
    # a parameter's local gradient sums this rank's rows: a partial sum over every mesh dim that shards the rows
    grad = tuple(Partial() if p.is_shard() else Replicate() for p in placements)
    out = _run_local(
        plan,
        x.to_local(),
        None if residual is None else residual.to_local(),
        None if weight is None else weight.to_local(grad_placements=grad),
        None if bias is None else bias.to_local(grad_placements=grad),
        n,
        seed,
    )

    def wrap(local: Tensor, like: Tensor) -> DTensor:
        return DTensor.from_local(local, mesh, placements, run_check=False, shape=like.shape, stride=like.stride())

    if residual is None:
        return wrap(out, x)
    y, new_residual = out
    return wrap(y, x), wrap(new_residual, x)


# ---- fused_add_norm: the validated public entry point -------------------------------------------------------------
def _resolve_spec(spec: NormSpec | str | dict[str, Any] | None) -> LayerNormSpec | RMSNormSpec:
    if spec is None:
        spec = _DEFAULT_SPEC
    elif isinstance(spec, str) and spec.lower() in _NAMED_SPECS:
        spec = _NAMED_SPECS[spec.lower()]  # a plain lookup: traceable by torch.compile
    elif not isinstance(spec, NormSpec):
        spec = norm_spec(spec)
    if not isinstance(spec, (LayerNormSpec, RMSNormSpec)):
        raise ValueError(f"spec: the fused kernels run 'layernorm' and 'rmsnorm', got kind {spec.kind!r}")
    return spec


def _check_tensor(name: str, t: object, device: torch.device | None = None) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in KERNEL_DTYPES:
        raise TypeError(f"{name} must be {_DTYPE_NAMES} for the fused kernels, got {t.dtype}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected device {device} (the device of x), got {t.device}")


def _check_max_block_n(max_block_n: object) -> int:
    if max_block_n is None:
        return 0
    if isinstance(max_block_n, bool) or not isinstance(max_block_n, int):
        raise TypeError(f"max_block_n must be an int (a power of two) or None, got {type(max_block_n).__name__}")
    if max_block_n < 0 or (max_block_n & (max_block_n - 1)):
        raise ValueError(f"max_block_n must be a power of two (or 0/None for the default), got {max_block_n}")
    return max_block_n


def _normalized_shape(x: Tensor, weight: Tensor | None, normalized_shape) -> tuple[int, ...]:
    """The normalised trailing dims: given, else the weight's shape (which must then end x's shape), else x's last."""
    if normalized_shape is None:
        if not isinstance(weight, Tensor):
            if x.dim() == 0:
                raise ValueError("x: expected at least one dimension to normalise, got a 0-d tensor")
            return tuple(x.shape[-1:])
        shape = tuple(weight.shape)
        k = len(shape)
        if k == 0 or x.dim() < k or tuple(x.shape[-k:]) != shape:
            raise ValueError(
                f"weight: expected the shape of x's normalised trailing dimension(s), e.g. {tuple(x.shape[-1:])}, "
                f"got {shape} (x has shape {tuple(x.shape)}; pass normalized_shape= to normalise several dims)"
            )
        return shape
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    k = len(shape)
    if k == 0 or x.dim() < k or tuple(x.shape[-k:]) != shape:
        raise ValueError(f"x: expected trailing dimension(s) {shape} (normalized_shape), got shape {tuple(x.shape)}")
    return shape


def _seed_tensor(seed: int | Tensor | None, device: torch.device) -> Tensor:
    if seed is None:
        return torch.randint(0, 2**62, (1,), device=device, dtype=torch.int64)
    if isinstance(seed, Tensor):
        if seed.dtype.is_floating_point or seed.dtype.is_complex or seed.dtype == torch.bool or seed.numel() != 1:
            raise TypeError(f"seed must be an int or a one-element integer tensor, got {seed.dtype} {list(seed.shape)}")
        return seed.reshape(1).to(device=device, dtype=torch.int64)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, a one-element integer tensor or None, got {type(seed).__name__}")
    if not -(2**63) <= seed < 2**63:
        raise ValueError(f"seed must fit in 64 bits, got {seed}")
    return torch.tensor([seed], dtype=torch.int64, device=device)


def fused_add_norm(
    x: Tensor,
    residual: Tensor | None = None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    spec: NormSpec | str | dict[str, Any] | None = None,
    *,
    normalized_shape: int | Sequence[int] | None = None,
    dropout_p: float = 0.0,
    seed: int | Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    inplace_backward: bool = False,
    max_block_n: int | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """LayerNorm or RMSNorm of ``dropout(x) + residual`` in one Triton kernel, forward and backward.

    Returns ``y`` without a residual, else ``(y, new_residual)`` with ``new_residual = dropout(x) + residual`` (fp32
    when ``spec.residual_in_fp32``, else type promotion) and ``y = norm(new_residual)`` computed on the rounded new
    residual: the pre-norm block's hot path (flash-attn's ``layer_norm_fn(prenorm=True)``). Without dropout the
    results are those of ``lnblocks.norms`` modules with the same spec (eager), up to fp32 reduction order.

    - ``spec``: a ``LayerNormSpec``/``RMSNormSpec``, kind/preset name or config dict (default ``LayerNormSpec()``);
      its eps, zero-centred weight (``1 + w`` in fp32), HF cast order and ``residual_in_fp32`` apply.
    - ``weight``/``bias``: optional, shaped ``normalized_shape`` (default: the weight's shape, else ``x.shape[-1:]``),
      fp32 or half; gradients come back in their dtypes.
    - ``dropout_p``: dropout on ``x`` (the branch output) before the add, scaled by ``1 / (1 - p)``; the mask is a
      function of ``seed`` (int, one-element int tensor, or None = drawn from torch's generator) and the element's
      (row, column), recomputed in the backward. See ``dropout_mask``.
    - ``out_dtype``: dtype of ``y`` (default: what the eager module returns).
    - ``inplace_backward``: write dx into the incoming gradient of ``y`` to save memory. Only safe when nothing
      else reads that gradient (Liger#370: it corrupted Gemma2), hence off by default.
    - ``max_block_n``: widest row held in registers (power of two; testing and tuning knob).

    DTensor operands (sharded on batch/sequence dims, parameters replicated) run on each rank's local rows; see
    ``docs/kernels.md``. Double backward (``create_graph=True``) is supported: the gradient's graph is built through
    the reference math.
    """
    spec = _resolve_spec(spec)
    _check_tensor("x", x)
    reason = device_unavailable_reason(x)
    if reason is not None:
        raise ValueError(reason)
    shape = _normalized_shape(x, weight, normalized_shape)
    if residual is not None:
        _check_tensor("residual", residual, x.device)
        if residual.shape != x.shape:
            raise ValueError(f"residual: expected the same shape as x {tuple(x.shape)}, got {tuple(residual.shape)}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None:
            _check_tensor(name, t, x.device)
            if tuple(t.shape) != shape:
                raise ValueError(f"{name}: expected shape {shape} (normalized_shape), got {tuple(t.shape)}")
    if weight is not None and not spec.elementwise_affine:
        raise ValueError("weight: the spec has elementwise_affine=False, so no weight may be passed")
    if bias is not None and (spec.kind == "rmsnorm" or not spec.elementwise_affine or not spec.bias):
        raise ValueError(f"bias: not allowed with this spec ({spec.kind}, bias disabled), got a tensor")
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) or not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be a float in [0, 1), got {dropout_p!r}")
    if out_dtype is not None and out_dtype not in KERNEL_DTYPES:
        raise TypeError(f"out_dtype must be {_DTYPE_NAMES} or None, got {out_dtype}")
    if not isinstance(inplace_backward, bool):
        raise TypeError(f"inplace_backward must be a bool, got {type(inplace_backward).__name__}")
    n = math.prod(shape)
    if any(is_dtensor(t) for t in (x, residual, weight, bias)):
        reason = sharding_unavailable_reason(x, residual, (("weight", weight), ("bias", bias)), n)
        if reason is not None:
            raise ValueError(f"the fused kernels cannot run this DTensor call: {reason}")
    plan = make_plan(
        spec,
        x.dtype,
        None if residual is None else residual.dtype,
        None if weight is None else weight.dtype,
        out_dtype,
        float(dropout_p),
        _check_max_block_n(max_block_n),
        inplace_backward,
    )
    seed_t = _seed_tensor(seed, x.device) if dropout_p > 0 else None
    return run_fused(plan, x, residual, weight, bias, n, seed_t)


def dropout_mask(seed: int | Tensor, shape: tuple[int, int], p: float, device: torch.device | str = "cuda") -> Tensor:
    """Boolean keep-mask ``(M, N)`` that ``fused_add_norm(..., dropout_p=p, seed=seed)`` applies to rows of x.

    Element (row, col) is kept when Philox-4x32-7(seed, row * N + col) / 2^32 >= p; kept values are scaled by
    ``1 / (1 - p)``.
    """
    m, n = shape
    device = torch.device(device)
    return launch_keep_mask(_seed_tensor(seed, device), m, n, p, device)
