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

import numbers
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from lnblocks.config import check_float
from lnblocks.norms.spec import CAST_MODES, CastMode

_HALF = (torch.float16, torch.bfloat16)
# compute_dtype of the float dtypes, precomputed: these functions run on every norm call, and a dict lookup costs a
# fraction of ``torch.promote_types`` (per-call overhead, benchmarks/norms/bench_norm_overhead.py).
_COMPUTE_DTYPES = {d: torch.promote_types(d, torch.float32) for d in (*_HALF, torch.float32, torch.float64)}
FLOAT_DTYPES = tuple(_COMPUTE_DTYPES)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for half inputs and fp32, fp64 for fp64: where statistics are accumulated."""
    cdt = _COMPUTE_DTYPES.get(dtype)
    return torch.promote_types(dtype, torch.float32) if cdt is None else cdt


def resolve_rms_eps(eps: float | None, dtype: torch.dtype) -> float:
    """RMSNorm's ``eps=None`` means machine epsilon of the compute dtype of an input of ``dtype``, as ``F.rms_norm``
    does (fp32's for half inputs). The one home of this rule: the module routes and the kernel plans ask it."""
    return torch.finfo(compute_dtype(dtype)).eps if eps is None else eps


# ---- argument checks (the public functions; modules check once per route instead) ------------------------------
def _is_int(d: object) -> bool:
    return isinstance(d, numbers.Integral) and not isinstance(d, bool)  # numpy ints too, as torch.nn.LayerNorm


def as_normalized_shape(normalized_shape: object, name: str = "normalized_shape") -> tuple[int, ...]:
    """``normalized_shape`` as a tuple of positive ints (an int, or a non-empty sequence of ints)."""
    if _is_int(normalized_shape):
        shape: tuple = (normalized_shape,)
    elif isinstance(normalized_shape, Sequence) and not isinstance(normalized_shape, str):
        shape = tuple(normalized_shape)
    else:
        shape = ()
    if not shape or not all(_is_int(d) for d in shape):
        raise TypeError(f"{name} must be an int or a non-empty sequence of ints, got {normalized_shape!r}")
    shape = tuple(int(d) for d in shape)
    if any(d <= 0 for d in shape):
        raise ValueError(f"{name} must have positive sizes, got {shape}")
    return shape


def check_float_tensor(name: str, t: object) -> None:
    """``t`` is a floating-point tensor of a dtype the math supports."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be a floating-point tensor (float16, bfloat16, float32, float64), got {t.dtype}")


def check_trailing(x: Tensor, shape: tuple[int, ...]) -> None:
    """``x``'s trailing dims are ``shape`` (what ``normalized_shape`` means)."""
    k = len(shape)
    if x.dim() < k or tuple(x.shape[-k:]) != shape:
        raise ValueError(f"x: expected trailing dimension(s) {shape} (normalized_shape), got shape {tuple(x.shape)}")


def check_param(name: str, t: object, shape: tuple[int, ...], what: str = "normalized_shape") -> None:
    """A parameter the math reads: None, or a floating-point tensor of exactly ``shape`` (no broadcasting)."""
    if t is None:
        return
    check_float_tensor(name, t)
    if tuple(t.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape} ({what}), got {tuple(t.shape)}")


def _checked(x: Tensor, normalized_shape: object, **params: Tensor | None) -> tuple[int, ...]:
    check_float_tensor("x", x)
    shape = as_normalized_shape(normalized_shape)
    check_trailing(x, shape)
    for name, t in params.items():
        check_param(name, t, shape)
    return shape


# ---- the math ------------------------------------------------------------------------------------------------------
def _reduce_dims(normalized_shape: Sequence[int]) -> int | tuple[int, ...]:
    # HF classes reduce with `.mean(-1, keepdim=True)`; keep that exact call for the usual 1-D case.
    n = len(normalized_shape)
    return -1 if n == 1 else tuple(range(-n, 0))


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


def output_dtype(kind: str, cast: CastMode, input_dtype: torch.dtype, weight_dtype: torch.dtype | None) -> torch.dtype:
    """The dtype ``layer_norm``/``rms_norm`` return for an input of ``input_dtype`` (``kind``: ``"layernorm"`` or
    ``"rmsnorm"``; ``weight_dtype`` None without a weight). The one home of this rule: modules and kernels ask it.

    The input dtype, except for the HF RMSNorm cast orders: ``"llama"`` multiplies in promoted precision
    (``weight * h.to(input_dtype)``), ``"t5"`` rounds to a half-precision weight's dtype and otherwise keeps the
    compute dtype (``T5LayerNorm``).
    """
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
) -> Tensor:
    """``torch.nn.LayerNorm`` math (``F.layer_norm``: fp32 statistics and affine, one cast at the end).

    ``zero_centered``: the stored weight ``w`` is applied as ``1 + w`` with the ``+ 1`` done in fp32, so a
    bf16 ``w`` of 0.0039 does not round ``1 + w`` back to 1 (Liger-Kernel#1462).
    """
    shape = _checked(x, normalized_shape, weight=weight, bias=bias)
    return _layer_norm(x, shape, weight, bias, check_float("eps", eps, lo=0), zero_centered)


def _layer_norm(x, normalized_shape, weight, bias, eps, zero_centered):
    if weight is not None and (zero_centered or weight.dtype != x.dtype):
        # Parameters in the compute dtype: the `+ 1` happens in fp32, and F.layer_norm accepts fp32 parameters
        # with half inputs (an fp32 residual stream meeting bf16 weights is upcast, as the weights are exact in fp32).
        cdt = torch.promote_types(compute_dtype(x.dtype), weight.dtype)
        weight = 1.0 + weight.to(cdt) if zero_centered else weight.to(cdt)
        bias = None if bias is None else bias.to(cdt)
    return F.layer_norm(x, normalized_shape, weight, bias, eps)


def rms_norm(
    x: Tensor,
    normalized_shape: int | Sequence[int],
    weight: Tensor | None = None,
    eps: float | None = None,
    cast: CastMode = "fp32",
    zero_centered: bool = False,
) -> Tensor:
    """RMSNorm with the cast order of ``cast`` (see ``RMSNormSpec``); ``eps=None``: see ``resolve_rms_eps``.

    ``"fp32"`` equals ``F.rms_norm`` bit for bit where weight and input share a dtype (tested), and is op for op
    ``Olmo2RMSNorm`` and (with ``zero_centered``) ``GemmaRMSNorm``; ``"llama"`` is ``LlamaRMSNorm``; ``"t5"`` is
    ``T5LayerNorm``.
    """
    shape = _checked(x, normalized_shape, weight=weight)
    eps = resolve_rms_eps(check_float("eps", eps, lo=0, allow_none=True), x.dtype)
    if cast not in CAST_MODES:
        raise ValueError(f"cast must be one of {list(CAST_MODES)}, got {cast!r}")
    return _rms_norm(x, shape, weight, eps, cast, zero_centered)


def _rms_norm(x, normalized_shape, weight, eps, cast, zero_centered):
    dtype = x.dtype
    cdt = _COMPUTE_DTYPES.get(dtype) or compute_dtype(dtype)  # inline: this runs on every call
    dims = -1 if len(normalized_shape) == 1 else _reduce_dims(normalized_shape)
    h = x.to(cdt)
    if cast == "t5":
        # T5LayerNorm multiplies the *uncast* input by the fp32 rsqrt (promotion does the upcast), so autograd
        # sums two half-precision grads for x; written the same way to match its backward bit for bit.
        h = x * torch.rsqrt(h.pow(2).mean(dims, keepdim=True) + eps)
    else:
        h = h * torch.rsqrt(h.pow(2).mean(dims, keepdim=True) + eps)
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


def _check_scalar_param(name: str, t: object) -> None:
    check_float_tensor(name, t)
    if t.numel() != 1:
        raise ValueError(f"{name}: expected a one-element tensor, got shape {tuple(t.shape)}")


def dyt(x: Tensor, alpha: Tensor, weight: Tensor | None = None, bias: Tensor | None = None) -> Tensor:
    """Dynamic Tanh (Zhu et al. 2025): ``weight * tanh(alpha * x) + bias``, in fp32, one cast at the end.

    ``alpha`` is one scalar; ``weight``/``bias`` are shaped like x's trailing dims (never broadcast over others).
    """
    check_float_tensor("x", x)
    _check_scalar_param("alpha", alpha)
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None:
            check_float_tensor(name, t)
            k = t.dim()
            if k == 0 or x.dim() < k or t.shape != x.shape[-k:]:
                raise ValueError(f"{name}: expected the shape of x's trailing dimension(s), got {tuple(t.shape)} "
                                 f"for x of shape {tuple(x.shape)}")  # fmt: skip
    return _dyt(x, alpha, weight, bias)


def _dyt(x, alpha, weight, bias):
    cdt = compute_dtype(x.dtype)
    h = torch.tanh(alpha.to(cdt) * x.to(cdt))
    if weight is not None:
        h = h * weight.to(cdt)
    if bias is not None:
        h = h + bias.to(cdt)
    return h.to(x.dtype)


def scale_norm(x: Tensor, normalized_shape: int | Sequence[int], scale: Tensor, eps: float = 1e-5) -> Tensor:
    """ScaleNorm (Nguyen & Salazar 2019): ``scale * x / max(||x||_2, eps)`` over the normalised dims, in fp32."""
    shape = _checked(x, normalized_shape)
    _check_scalar_param("scale", scale)
    return _scale_norm(x, shape, scale, check_float("eps", eps, lo=0))


def _scale_norm(x, normalized_shape, scale, eps):
    cdt = compute_dtype(x.dtype)
    h = x.to(cdt)
    dims = tuple(range(-len(normalized_shape), 0))
    norm = torch.linalg.vector_norm(h, ord=2, dim=dims, keepdim=True).clamp_min(eps)
    return (h * (scale.to(cdt) / norm)).to(x.dtype)
