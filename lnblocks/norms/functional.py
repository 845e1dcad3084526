"""The reference math of every norm variant: the one source of truth.

Each function is plain PyTorch, differentiable by autograd, and written op for op like the implementation it must
match bit for bit (``torch.nn.functional``, or the HF class named in the docstring). Kernel tests compare the fused
kernels with them, in the same dtype and in fp64 (pass fp64 tensors: the compute dtype is ``promote(x.dtype, fp32)``,
so fp64 stays fp64).

The public functions check their arguments as ``torch.nn.functional`` does (``normalized_shape`` must be non-empty
and end x's shape, parameters must have that shape: never a broadcast over something else), raising ``ValueError``/
``TypeError`` that name the argument. Modules validate once per route (``lnblocks.norms.routing``) and then call the
unchecked ``_``-prefixed forms of the same math on every call.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from lnblocks.config import check_float
from lnblocks.norms.checks import (  # noqa: F401 (public through this module: routing and the HF patcher use them)
    FLOAT_DTYPES,
    as_normalized_shape,
    check_float_tensor,
    check_gate,
    check_group_size,
    check_param,
    check_pointwise_args,
    check_scalar_param,
    check_trailing,
    checked_shape,
)
from lnblocks.norms.spec import (
    CAST_MODES,
    LAYERNORM_CASTS,
    CastMode,
    GateActivation,
    GatedCast,
    GatePosition,
    LayerNormCast,
)

_HALF = (torch.float16, torch.bfloat16)
# compute_dtype of the float dtypes, precomputed: these functions run on every norm call, and a dict lookup costs a
# fraction of ``torch.promote_types`` (per-call overhead, benchmarks/norms/bench_norm_overhead.py).
_COMPUTE_DTYPES = {d: torch.promote_types(d, torch.float32) for d in FLOAT_DTYPES}


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for half inputs and fp32, fp64 for fp64: where statistics are accumulated."""
    cdt = _COMPUTE_DTYPES.get(dtype)
    return torch.promote_types(dtype, torch.float32) if cdt is None else cdt


def resolve_rms_eps(eps: float | None, dtype: torch.dtype) -> float:
    """RMSNorm's ``eps=None`` means machine epsilon of the compute dtype of an input of ``dtype``, as ``F.rms_norm``
    does (fp32's for half inputs). The one home of this rule: the module routes and the kernel plans ask it."""
    return torch.finfo(compute_dtype(dtype)).eps if eps is None else eps


# ---- the math ------------------------------------------------------------------------------------------------------
def _reduce_dims(normalized_shape: Sequence[int]) -> int | tuple[int, ...]:
    # HF classes reduce with `.mean(-1, keepdim=True)`; keep that exact call for the usual 1-D case.
    n = len(normalized_shape)
    return -1 if n == 1 else tuple(range(-n, 0))


def resolve_group_size(group_size: int | None, per_head: bool, normalized_shape: tuple[int, ...] | None) -> int | None:
    """The group size a module normalises over: ``group_size``, or the last dim with ``per_head``; None when the
    group is the whole row (one group is no grouping). Checked against the module's shape."""
    if normalized_shape is None:
        return None
    if per_head:
        group_size = normalized_shape[-1]
    group_size = check_group_size(group_size, normalized_shape)
    return None if group_size == math.prod(normalized_shape) else group_size


def _grouped(h: Tensor, normalized_shape: Sequence[int], group_size: int | None) -> Tensor:
    """``h`` viewed so its last dim is one group: ``(..., groups, group_size)``, or as it is without groups."""
    if group_size is None:
        return h
    k = len(normalized_shape)
    return h.reshape(*h.shape[: h.dim() - k], -1, group_size)


def add_residual(x: Tensor, residual: Tensor, residual_in_fp32: bool = False) -> Tensor:
    """The pre-norm residual update ``x + residual``; in fp32 (fp64 stays fp64) when ``residual_in_fp32``.

    ``residual`` must have x's shape: the residual stream is never broadcast."""
    check_float_tensor("x", x)
    check_float_tensor("residual", residual)
    if residual.shape != x.shape:
        raise ValueError(
            f"residual: expected the same shape as x {tuple(x.shape)}, got {tuple(residual.shape)} (no broadcasting)"
        )
    return _add_residual(x, residual, residual_in_fp32)


def _add_residual(x: Tensor, residual: Tensor, residual_in_fp32: bool) -> Tensor:
    if residual_in_fp32:
        return x.to(compute_dtype(x.dtype)) + residual.to(compute_dtype(residual.dtype))
    return x + residual


def new_residual_dtype(x_dtype: torch.dtype, residual_dtype: torch.dtype, residual_in_fp32: bool) -> torch.dtype:
    """The dtype ``add_residual`` returns (the residual stream's dtype after the update)."""
    if residual_in_fp32:
        return torch.promote_types(compute_dtype(x_dtype), compute_dtype(residual_dtype))
    return torch.promote_types(x_dtype, residual_dtype)


def output_dtype(
    kind: str, cast: str, input_dtype: torch.dtype, weight_dtype: torch.dtype | None, gate_after: bool = False
) -> torch.dtype:
    """The dtype a norm of ``kind`` returns for an input of ``input_dtype`` (``weight_dtype`` None without a weight;
    ``gate_after``: a gated RMSNorm whose gate follows the norm). The one home of this rule: modules and kernels ask it.

    The input dtype, except for the HF RMSNorm cast orders: ``"llama"`` multiplies in promoted precision
    (``weight * h.to(input_dtype)``; so do the gated norms with the gate before it, ``MambaRMSNormGated``), ``"t5"``
    rounds to a half-precision weight's dtype and otherwise keeps the compute dtype (``T5LayerNorm``).
    """
    if kind == "gated_rmsnorm" and not gate_after and cast == "llama" and weight_dtype is not None:
        return torch.promote_types(weight_dtype, input_dtype)
    if kind != "rmsnorm" or weight_dtype is None or cast == "fp32":
        return input_dtype
    if cast == "llama":
        return torch.promote_types(weight_dtype, input_dtype)
    if weight_dtype in _HALF:  # t5
        return weight_dtype
    return torch.promote_types(compute_dtype(input_dtype), weight_dtype)


def layer_norm(
    x: Tensor,
    normalized_shape: int | Sequence[int],
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
    zero_centered: bool = False,
    cast: LayerNormCast = "fp32",
    group_size: int | None = None,
) -> Tensor:
    """``torch.nn.LayerNorm`` math (``F.layer_norm``: fp32 statistics and affine, one cast at the end), or the HF
    class ``cast`` names (see ``LayerNormSpec``); ``group_size``: statistics per group of that many elements.

    ``zero_centered``: the stored weight ``w`` is applied as ``1 + w`` with the ``+ 1`` done in fp32, so a
    bf16 ``w`` of 0.0039 does not round ``1 + w`` back to 1 (Liger-Kernel#1462); ``cast="nemotron"`` adds it in the
    weight's dtype, as ``NemotronLayerNorm1P`` does.
    """
    shape = checked_shape(x, normalized_shape, weight=weight, bias=bias)
    if cast not in LAYERNORM_CASTS:
        raise ValueError(f"cast must be one of {list(LAYERNORM_CASTS)}, got {cast!r}")
    eps = check_float("eps", eps, lo=0)
    return _layer_norm(x, shape, weight, bias, eps, zero_centered, cast, check_group_size(group_size, shape))


def _layer_norm(x, normalized_shape, weight, bias, eps, zero_centered, cast="fp32", group_size=None):
    if cast == "cohere":
        return _layer_norm_cohere(x, normalized_shape, weight, bias, eps, zero_centered, group_size)
    if cast == "nemotron":
        return _layer_norm_1p(x, normalized_shape, weight, bias, eps, zero_centered, group_size)
    if group_size is not None:
        cdt = compute_dtype(x.dtype)
        h = F.layer_norm(_grouped(x.to(cdt), normalized_shape, group_size), (group_size,), None, None, eps)
        return _affine(h.reshape(x.shape), weight, bias, zero_centered, cdt).to(x.dtype)
    if weight is not None and (zero_centered or weight.dtype != x.dtype):
        # Parameters in the compute dtype: the `+ 1` happens in fp32, and F.layer_norm accepts fp32 parameters
        # with half inputs (an fp32 residual stream meeting bf16 weights is upcast, as the weights are exact in fp32).
        cdt = torch.promote_types(compute_dtype(x.dtype), weight.dtype)
        weight = 1.0 + weight.to(cdt) if zero_centered else weight.to(cdt)
        bias = None if bias is None else bias.to(cdt)
    return F.layer_norm(x, normalized_shape, weight, bias, eps)


def _affine(h: Tensor, weight: Tensor | None, bias: Tensor | None, zero_centered: bool, cdt: torch.dtype) -> Tensor:
    """``h * w + b`` in the compute dtype (``w`` applied as ``1 + w`` when zero-centred)."""
    if weight is not None:
        w = weight.to(cdt)
        h = (1.0 + w if zero_centered else w) * h
    return h if bias is None else h + bias.to(cdt)


def _layer_norm_cohere(x, normalized_shape, weight, bias, eps, zero_centered, group_size):
    """``CohereLayerNorm`` op for op: mean, centred variance (the difference taken twice, as there), weight in fp32."""
    dtype, cdt = x.dtype, compute_dtype(x.dtype)
    dims = -1 if len(normalized_shape) == 1 or group_size is not None else _reduce_dims(normalized_shape)
    h = _grouped(x.to(cdt), normalized_shape, group_size)
    mean = h.mean(dims, keepdim=True)
    variance = (h - mean).pow(2).mean(dims, keepdim=True)
    h = (h - mean) * torch.rsqrt(variance + eps)
    return _affine(h.reshape(x.shape), weight, bias, zero_centered, cdt).to(dtype)


def _layer_norm_1p(x, normalized_shape, weight, bias, eps, zero_centered, group_size):
    """``NemotronLayerNorm1P``: ``F.layer_norm`` with ``weight + 1`` (in the weight's dtype) and its autocast rule:
    with CUDA autocast on (the class reads ``torch.is_autocast_enabled()``, the CUDA flag) the input, ``1 + w`` and
    the bias are cast to the autocast dtype; the norm itself runs with autocast off."""
    if weight is not None and zero_centered:
        weight = weight + 1.0
    device_type = x.device.type
    if torch.is_autocast_enabled():
        target = torch.get_autocast_dtype(device_type)
        x, weight, bias = (_autocast_cast(t, device_type, target) for t in (x, weight, bias))
    if torch.is_autocast_enabled(device_type):
        with torch.autocast(device_type, enabled=False):
            return _layer_norm(x, normalized_shape, weight, bias, eps, False, "fp32", group_size)
    return _layer_norm(x, normalized_shape, weight, bias, eps, False, "fp32", group_size)


def _autocast_cast(t: Tensor | None, device_type: str, dtype: torch.dtype) -> Tensor | None:
    """What autocast's own argument cast does: floating tensors on ``device_type`` except fp64 go to ``dtype``."""
    if t is None or not t.is_floating_point() or t.device.type != device_type or t.dtype == torch.float64:
        return t
    return t.to(dtype)


def rms_norm(
    x: Tensor,
    normalized_shape: int | Sequence[int],
    weight: Tensor | None = None,
    eps: float | None = None,
    cast: CastMode = "fp32",
    zero_centered: bool = False,
    group_size: int | None = None,
) -> Tensor:
    """RMSNorm with the cast order of ``cast`` (see ``RMSNormSpec``); ``eps=None``: see ``resolve_rms_eps``;
    ``group_size``: RMS per group of that many elements (the view ``(..., groups, group_size)`` the HF grouped
    norms take).

    ``"fp32"`` equals ``F.rms_norm`` bit for bit where weight and input share a dtype (tested), and is op for op
    ``Olmo2RMSNorm`` and (with ``zero_centered``) ``GemmaRMSNorm``; ``"llama"`` is ``LlamaRMSNorm``; ``"t5"`` is
    ``T5LayerNorm``.
    """
    shape = checked_shape(x, normalized_shape, weight=weight)
    eps = resolve_rms_eps(check_float("eps", eps, lo=0, allow_none=True), x.dtype)
    if cast not in CAST_MODES:
        raise ValueError(f"cast must be one of {list(CAST_MODES)}, got {cast!r}")
    return _rms_norm(x, shape, weight, eps, cast, zero_centered, check_group_size(group_size, shape))


def _rms_norm(x, normalized_shape, weight, eps, cast, zero_centered, group_size=None):
    dtype = x.dtype
    cdt = _COMPUTE_DTYPES.get(dtype) or compute_dtype(dtype)  # inline: this runs on every call
    h = x.to(cdt)
    if group_size is None:
        dims = -1 if len(normalized_shape) == 1 else _reduce_dims(normalized_shape)
        # T5LayerNorm multiplies the *uncast* input by the fp32 rsqrt (promotion does the upcast), so autograd sums
        # two half-precision grads for x; written the same way to match its backward bit for bit.
        h = (x if cast == "t5" else h) * torch.rsqrt(h.pow(2).mean(dims, keepdim=True) + eps)
    else:
        h = _rms_groups(x, h, normalized_shape, eps, cast == "t5", group_size)
    if cast == "llama":
        h = h.to(dtype)
        return h if weight is None else weight * h
    if cast == "fp32":
        if weight is not None:
            w = weight.to(torch.promote_types(h.dtype, weight.dtype))
            h = h * (1.0 + w if zero_centered else w)
        return h.to(dtype)
    if weight is None:  # t5
        return h.to(dtype)
    if weight.dtype in _HALF:
        h = h.to(weight.dtype)
    return weight * h


def _rms_groups(x, h, normalized_shape, eps, uncast_input, group_size):
    """``h * rsqrt(mean(h^2) + eps)`` per group (``uncast_input``: the T5 order), viewed back to x's shape."""
    hg = _grouped(h, normalized_shape, group_size)
    src = _grouped(x, normalized_shape, group_size) if uncast_input else hg
    return (src * torch.rsqrt(hg.pow(2).mean(-1, keepdim=True) + eps)).reshape(x.shape)


def dyt(x: Tensor, alpha: Tensor, weight: Tensor | None = None, bias: Tensor | None = None) -> Tensor:
    """Dynamic Tanh (Zhu et al. 2025): ``weight * tanh(alpha * x) + bias``, in fp32, one cast at the end.

    ``alpha`` is one scalar; ``weight``/``bias`` are shaped like x's trailing dims (never broadcast over others).
    """
    check_pointwise_args(x, {"alpha": alpha}, weight, bias)
    return _dyt(x, alpha, weight, bias)


def _dyt(x, alpha, weight, bias):
    cdt = compute_dtype(x.dtype)
    h = torch.tanh(alpha.to(cdt) * x.to(cdt))
    if weight is not None:
        h = h * weight.to(cdt)
    if bias is not None:
        h = h + bias.to(cdt)
    return h.to(x.dtype)


def derf(x: Tensor, alpha: Tensor, shift: Tensor, weight: Tensor | None = None, bias: Tensor | None = None) -> Tensor:
    """Dynamic erf (Chen et al. 2025, arXiv 2512.10938): ``weight * erf(alpha * x + shift) + bias``, in fp32, one cast
    at the end (DyT's convention). ``alpha``, ``shift``: one-element tensors; ``weight``/``bias``: x's trailing dims."""
    check_pointwise_args(x, {"alpha": alpha, "shift": shift}, weight, bias)
    return _derf(x, alpha, shift, weight, bias)


def _derf(x, alpha, shift, weight, bias):
    cdt = compute_dtype(x.dtype)
    h = torch.erf(alpha.to(cdt) * x.to(cdt) + shift.to(cdt))
    if weight is not None:
        h = h * weight.to(cdt)
    if bias is not None:
        h = h + bias.to(cdt)
    return h.to(x.dtype)


def l2_norm(x: Tensor, normalized_shape: int | Sequence[int], eps: float = 1e-6, reduction: str = "mean") -> Tensor:
    """``x * rsqrt(mean(x^2) + eps)`` (``reduction="mean"``, ``Llama4TextL2Norm`` op for op) or
    ``x * rsqrt(sum(x^2) + eps)`` (``"sum"``: unit L2 norm) over the normalised dims, in fp32, one cast at the end."""
    shape = checked_shape(x, normalized_shape)
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    return _l2_norm(x, shape, check_float("eps", eps, lo=0), reduction)


def _l2_norm(x, normalized_shape, eps, reduction):
    h = x.to(compute_dtype(x.dtype))
    dims = -1 if len(normalized_shape) == 1 else _reduce_dims(normalized_shape)
    square = h.pow(2)
    total = square.mean(dims, keepdim=True) if reduction == "mean" else square.sum(dims, keepdim=True)
    return (h * torch.rsqrt(total + eps)).to(x.dtype)


def scale_norm(x: Tensor, normalized_shape: int | Sequence[int], scale: Tensor, eps: float = 1e-5) -> Tensor:
    """ScaleNorm (Nguyen & Salazar 2019): ``scale * x / max(||x||_2, eps)`` over the normalised dims, in fp32."""
    shape = checked_shape(x, normalized_shape)
    check_scalar_param("scale", scale)
    return _scale_norm(x, shape, scale, check_float("eps", eps, lo=0))


def _scale_norm(x, normalized_shape, scale, eps):
    cdt = compute_dtype(x.dtype)
    h = x.to(cdt)
    dims = tuple(range(-len(normalized_shape), 0))
    norm = torch.linalg.vector_norm(h, ord=2, dim=dims, keepdim=True).clamp_min(eps)
    return (h * (scale.to(cdt) / norm)).to(x.dtype)


# ---- the gated RMSNorm -------------------------------------------------------------------------------------------
_ACTIVATIONS = {"silu": F.silu, "sigmoid": torch.sigmoid}


def gated_rms_norm(
    x: Tensor,
    gate: Tensor | None,
    normalized_shape: int | Sequence[int],
    weight: Tensor | None = None,
    eps: float = 1e-6,
    position: GatePosition = "before",
    activation: GateActivation = "silu",
    cast: GatedCast = "llama",
    group_size: int | None = None,
) -> Tensor:
    """The gated RMSNorm of the hybrid SSM / linear-attention families (``GatedRMSNormSpec``): ``rms(x * act(gate)) *
    w`` (``position="before"``, ``MambaRMSNormGated``) or ``rms(x) * w * act(gate)`` (``"after"``,
    ``Qwen3NextRMSNormGated``), written op for op like those classes; ``gate`` has x's shape (None: no gate).
    Computed in fp32 (fp64 for fp64 inputs: the reference the kernels are tested against)."""
    shape = checked_shape(x, normalized_shape, weight=weight)
    if gate is not None:
        check_gate(gate, x)
    for name, value, choices in (("position", position, ("before", "after")), ("activation", activation,
                                 tuple(_ACTIVATIONS)), ("cast", cast, ("llama", "fp32"))):  # fmt: skip
        if value not in choices:
            raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
    eps = check_float("eps", eps, lo=0)
    return _gated_rms_norm(x, gate, shape, weight, eps, position, activation, cast, check_group_size(group_size, shape))


def _gated_rms_norm(x, gate, normalized_shape, weight, eps, position, activation, cast, group_size):
    dtype = x.dtype
    cdt = compute_dtype(dtype)
    act = _ACTIVATIONS[activation]
    h = x.to(cdt)
    if gate is not None and position == "before":
        h = h * act(gate.to(cdt))
    if group_size is None:
        dims = -1 if len(normalized_shape) == 1 else _reduce_dims(normalized_shape)
        h = h * torch.rsqrt(h.pow(2).mean(dims, keepdim=True) + eps)
    else:
        h = _rms_groups(h, h, normalized_shape, eps, False, group_size)
    if cast == "llama":  # MambaRMSNormGated, Qwen3NextRMSNormGated: `weight * h.to(input_dtype)`
        h = h.to(dtype)
    if weight is not None:
        h = weight * h  # fp32 cast (FalconH1): the weight is promoted to fp32 by the multiply
    if position == "after":
        if gate is not None:
            h = h * act(gate.to(cdt))
        return h.to(dtype)
    return h if cast == "llama" else h.to(dtype)
