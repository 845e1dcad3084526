"""Entry points of the fused kernels, validated: ``fused_add_norm`` (add, then norm), ``fused_norm_then_add`` (norm,
then add), ``fused_gated_rms_norm`` and ``dropout_mask``; ``run_fused`` (the hot path, for operands a caller already
validated) is re-exported from ``lnblocks.kernels.run``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from lnblocks.kernels.launch import launch_keep_mask
from lnblocks.kernels.plan import (
    KERNEL_DTYPES,
    device_unavailable_reason,
    is_dtensor,
    make_plan,
    sharding_unavailable_reason,
)
from lnblocks.kernels.run import (  # noqa: F401 (the hot path's names, public here: lnblocks.norms.routing calls them)
    StaleOperandError,
    gate_unavailable_reason,
    operand_unavailable_reason,
    run_fused,
)
from lnblocks.norms import functional as LF
from lnblocks.norms.spec import NORM_PRESETS, GatedRMSNormSpec, LayerNormSpec, NormSpec, RMSNormSpec, norm_spec

_DTYPE_NAMES = "float16, bfloat16 or float32"
_DEFAULT_SPEC = LayerNormSpec()
_NAMED_SPECS = {"layernorm": _DEFAULT_SPEC, "rmsnorm": RMSNormSpec(), **NORM_PRESETS}


# ---- fused_add_norm: the validated public entry point -------------------------------------------------------------
_ADD_KINDS = ("layernorm", "rmsnorm", "l2norm", "dyt", "derf")  # what fused_add_norm / fused_norm_then_add run


def _resolve_spec(spec: NormSpec | str | dict[str, Any] | None, kinds: tuple[str, ...] = _ADD_KINDS) -> NormSpec:
    if spec is None:
        spec = _DEFAULT_SPEC
    elif isinstance(spec, str) and spec.lower() in _NAMED_SPECS:
        spec = _NAMED_SPECS[spec.lower()]  # a plain lookup: traceable by torch.compile
    elif not isinstance(spec, NormSpec):
        spec = norm_spec(spec)
    if spec.kind not in kinds:
        hint = " (the gated norm: fused_gated_rms_norm)" if spec.kind == "gated_rmsnorm" else ""
        raise ValueError(f"spec: this entry point runs {', '.join(map(repr, kinds))}, got kind {spec.kind!r}{hint}")
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


def _check_parameters(spec: NormSpec, x: Tensor, shape, weight, bias, alpha, shift) -> None:
    """The parameters a spec reads, and only those: shaped ``normalized_shape`` (scalars: one element), on x's
    device."""
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None:
            _check_tensor(name, t, x.device)
            if tuple(t.shape) != shape:
                raise ValueError(f"{name}: expected shape {shape} (normalized_shape), got {tuple(t.shape)}")
    affine = getattr(spec, "elementwise_affine", False)
    if weight is not None and not affine:
        raise ValueError(f"weight: the spec ({spec.kind}) has no weight (elementwise_affine=False), got a tensor")
    if bias is not None and not (affine and getattr(spec, "bias", False)):
        raise ValueError(f"bias: not allowed with this spec ({spec.kind}, bias disabled), got a tensor")
    wanted = {"dyt": ("alpha",), "derf": ("alpha", "shift")}.get(spec.kind, ())
    for name, t in (("alpha", alpha), ("shift", shift)):
        if name in wanted and t is None:
            raise ValueError(f"{name}: required by norm kind {spec.kind!r} (a one-element tensor)")
        if name not in wanted and t is not None:
            raise ValueError(f"{name}: norm kind {spec.kind!r} has no {name}, got a tensor")
        if t is not None:
            _check_tensor(name, t, x.device)
            if t.numel() != 1:
                raise ValueError(f"{name}: expected a one-element tensor, got shape {tuple(t.shape)}")


def _prepare(spec, x, residual, weight, bias, normalized_shape, alpha, shift, out_dtype, max_block_n, kinds=_ADD_KINDS):
    """Every check of a validated entry point; returns ``(spec, n, group_size, others, plan options)``."""
    spec = _resolve_spec(spec, kinds)
    _check_tensor("x", x)
    reason = device_unavailable_reason(x)
    if reason is not None:
        raise ValueError(reason)
    shape = _normalized_shape(x, weight, normalized_shape)
    if residual is not None:
        _check_tensor("residual", residual, x.device)
        if residual.shape != x.shape:
            raise ValueError(f"residual: expected the same shape as x {tuple(x.shape)}, got {tuple(residual.shape)}")
    _check_parameters(spec, x, shape, weight, bias, alpha, shift)
    if out_dtype is not None and out_dtype not in KERNEL_DTYPES:
        raise TypeError(f"out_dtype must be {_DTYPE_NAMES} or None, got {out_dtype}")
    n = math.prod(shape)
    group_size = LF.resolve_group_size(getattr(spec, "group_size", None), getattr(spec, "per_head", False), shape)
    others = tuple((name, t) for name, t in (("alpha", alpha), ("shift", shift)) if t is not None)
    if any(is_dtensor(t) for t in (x, residual, weight, bias, alpha, shift)):
        params = (("weight", weight), ("bias", bias), *others)
        reason = sharding_unavailable_reason(x, residual, params, n)
        if reason is not None:
            raise ValueError(f"the fused kernels cannot run this DTensor call: {reason}")
    return spec, n, group_size, others, _check_max_block_n(max_block_n)


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
    alpha: Tensor | None = None,
    shift: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """A norm of ``dropout(x) + residual`` in one Triton kernel, forward and backward.

    Returns ``y`` without a residual, else ``(y, new_residual)`` with ``new_residual = dropout(x) + residual`` (fp32
    when ``spec.residual_in_fp32``, else type promotion) and ``y = norm(new_residual)`` computed on the rounded new
    residual: the pre-norm block's hot path (flash-attn's ``layer_norm_fn(prenorm=True)``). Without dropout the
    results are those of ``lnblocks.norms`` modules with the same spec (eager), up to fp32 reduction order.

    - ``spec``: a spec of kind ``layernorm``, ``rmsnorm``, ``l2norm``, ``dyt`` or ``derf``, a kind/preset name or a
      config dict (default ``LayerNormSpec()``); its eps, zero-centred weight, HF cast order, groups
      (``group_size``/``per_head``), ``memory_efficient`` and ``residual_in_fp32`` apply.
    - ``weight``/``bias``: optional, shaped ``normalized_shape`` (default: the weight's shape, else ``x.shape[-1:]``),
      fp32 or half; gradients come back in their dtypes. ``alpha`` (DyT, Derf), ``shift`` (Derf): one-element tensors.
    - ``dropout_p``: dropout on ``x`` (the branch output) before the add, scaled by ``1 / (1 - p)``; the mask is a
      function of ``seed`` (int, one-element int tensor, or None = drawn from torch's generator) and the element's
      (row, column), recomputed in the backward. See ``dropout_mask``. Not with grouped statistics.
    - ``out_dtype``: dtype of ``y`` (default: what the eager module returns).
    - ``inplace_backward``: write dx into the incoming gradient of ``y`` to save memory. Only safe when nothing
      else reads that gradient (Liger#370: it corrupted Gemma2), hence off by default.
    - ``max_block_n``: widest row held in registers (power of two; testing and tuning knob).

    DTensor operands (sharded on batch/sequence dims, parameters replicated) run on each rank's local rows; see
    ``docs/kernels.md``. Double backward (``create_graph=True``) is supported: the gradient's graph is built through
    the reference math.
    """
    spec, n, group_size, others, max_block_n = _prepare(
        spec, x, residual, weight, bias, normalized_shape, alpha, shift, out_dtype, max_block_n
    )
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) or not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be a float in [0, 1), got {dropout_p!r}")
    if dropout_p > 0 and group_size is not None:
        raise ValueError("dropout_p: not with grouped statistics (group_size / per_head); dropout x first")
    if not isinstance(inplace_backward, bool):
        raise TypeError(f"inplace_backward must be a bool, got {type(inplace_backward).__name__}")
    plan = make_plan(
        spec,
        x.dtype,
        None if residual is None else residual.dtype,
        None if weight is None else weight.dtype,
        out_dtype,
        float(dropout_p),
        max_block_n,
        inplace_backward,
        group_size=group_size,
    )
    seed_t = _seed_tensor(seed, x.device) if dropout_p > 0 else None
    return run_fused(plan, x, residual, weight, bias, n, others, seed_t)


def fused_norm_then_add(
    x: Tensor,
    residual: Tensor,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    spec: NormSpec | str | dict[str, Any] | None = None,
    *,
    normalized_shape: int | Sequence[int] | None = None,
    out_dtype: torch.dtype | None = None,
    return_normed: bool = False,
    max_block_n: int | None = None,
    alpha: Tensor | None = None,
    shift: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """``residual + norm(x)`` in one Triton kernel, forward and backward: the post-norm residual update of OLMo 2's
    layers and Gemma 2/3's post-norms (``Norm.norm_then_add`` is the module form).

    Returns the new residual (``y + residual`` with y rounded to its dtype first, fp32 with
    ``spec.residual_in_fp32``); ``return_normed=True`` also writes y and returns ``(y, new_residual)``. Without it y
    is never written (nothing else reads it in those layers). The other arguments are ``fused_add_norm``'s. The
    backward saves x (not y: there is none), whatever ``spec.memory_efficient`` says.
    """
    if not isinstance(residual, Tensor):
        raise TypeError(f"residual must be a torch.Tensor, got {type(residual).__name__}")
    if not isinstance(return_normed, bool):
        raise TypeError(f"return_normed must be a bool, got {type(return_normed).__name__}")
    spec, n, group_size, others, max_block_n = _prepare(
        spec, x, residual, weight, bias, normalized_shape, alpha, shift, out_dtype, max_block_n
    )
    plan = make_plan(
        spec, x.dtype, residual.dtype, None if weight is None else weight.dtype, out_dtype, 0.0, max_block_n,
        group_size=group_size, norm_then_add=True, write_y=return_normed,
    )  # fmt: skip
    out = run_fused(plan, x, residual, weight, bias, n, others)
    return out if return_normed else out[1]


def fused_gated_rms_norm(
    x: Tensor,
    gate: Tensor | None,
    weight: Tensor | None = None,
    spec: GatedRMSNormSpec | str | dict[str, Any] | None = None,
    *,
    normalized_shape: int | Sequence[int] | None = None,
    out_dtype: torch.dtype | None = None,
    max_block_n: int | None = None,
) -> Tensor:
    """The gated RMSNorm (``GatedRMSNormSpec``: the gate before or after the norm, silu or sigmoid, groups) in one
    Triton kernel, forward and backward (the gate's gradient too). ``gate``: x's shape, or None (no gate)."""
    spec, n, group_size, _, max_block_n = _prepare(
        "mamba2_gated" if spec is None else spec, x, None, weight, None, normalized_shape, None, None, out_dtype,
        max_block_n, kinds=("gated_rmsnorm",),
    )  # fmt: skip
    if gate is not None:
        _check_tensor("gate", gate, x.device)
        if gate.shape != x.shape:
            raise ValueError(f"gate: expected the shape of x {tuple(x.shape)}, got {tuple(gate.shape)}")
        if is_dtensor(gate) != is_dtensor(x):
            raise ValueError("gate and x must both be DTensors or both plain tensors")
    plan = make_plan(
        spec, x.dtype, None, None if weight is None else weight.dtype, out_dtype, 0.0, max_block_n,
        group_size=group_size,
    )  # fmt: skip
    return run_fused(plan, x, None, weight, None, n, gate=gate)


def dropout_mask(seed: int | Tensor, shape: tuple[int, int], p: float, device: torch.device | str = "cuda") -> Tensor:
    """Boolean keep-mask ``(M, N)`` that ``fused_add_norm(..., dropout_p=p, seed=seed)`` applies to rows of x.

    Element (row, col) is kept when Philox-4x32-7(seed, row * N + col) / 2^32 >= p; kept values are scaled by
    ``1 / (1 - p)``.
    """
    m, n = shape
    device = torch.device(device)
    return launch_keep_mask(_seed_tensor(seed, device), m, n, p, device)
