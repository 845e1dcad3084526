"""The reference math of every norm variant: the one source of truth.

Each function is plain PyTorch, differentiable by autograd, and written op for op like the implementation it must
match bit for bit (``torch.nn.functional``, or the HF class named in the docstring). Modules call these functions for
``backend="torch"``; kernel tests compare the fused kernels with them, in the same dtype and in fp64 (pass fp64
tensors: the compute dtype is ``promote(x.dtype, fp32)``, so fp64 stays fp64).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from lnblocks.norms.spec import CastMode

_HALF = (torch.float16, torch.bfloat16)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for half inputs and fp32, fp64 for fp64: where statistics are accumulated."""
    return torch.promote_types(dtype, torch.float32)


def resolve_rms_eps(eps: float | None, dtype: torch.dtype) -> float:
    """``eps=None`` means machine epsilon of the compute dtype, as ``F.rms_norm`` does (fp32's for half inputs)."""
    return torch.finfo(compute_dtype(dtype)).eps if eps is None else eps


def _reduce_dims(normalized_shape: Sequence[int]) -> int | tuple[int, ...]:
    # HF classes reduce with `.mean(-1, keepdim=True)`; keep that exact call for the usual 1-D case.
    n = len(normalized_shape)
    return -1 if n == 1 else tuple(range(-n, 0))


def add_residual(x: Tensor, residual: Tensor, residual_in_fp32: bool = False) -> Tensor:
    """The pre-norm residual update ``x + residual``; in fp32 (fp64 stays fp64) when ``residual_in_fp32``."""
    if residual_in_fp32:
        return x.to(compute_dtype(x.dtype)) + residual.to(compute_dtype(residual.dtype))
    return x + residual


def layer_norm(
    x: Tensor,
    normalized_shape: Sequence[int],
    weight: Tensor | None,
    bias: Tensor | None,
    eps: float,
    zero_centered: bool = False,
) -> Tensor:
    """``torch.nn.LayerNorm`` math (``F.layer_norm``: fp32 statistics and affine, one cast at the end).

    ``zero_centered``: the stored weight ``w`` is applied as ``1 + w`` with the ``+ 1`` done in fp32, so a
    bf16 ``w`` of 0.0039 does not round ``1 + w`` back to 1 (Liger-Kernel#1462).
    """
    if weight is not None and (zero_centered or weight.dtype != x.dtype):
        # Parameters in the compute dtype: the `+ 1` happens in fp32, and F.layer_norm accepts fp32 parameters
        # with half inputs (an fp32 residual stream meeting bf16 weights is upcast, as the weights are exact in fp32).
        cdt = torch.promote_types(compute_dtype(x.dtype), weight.dtype)
        weight = 1.0 + weight.to(cdt) if zero_centered else weight.to(cdt)
        bias = None if bias is None else bias.to(cdt)
    return F.layer_norm(x, tuple(normalized_shape), weight, bias, eps)


def rms_norm(
    x: Tensor,
    normalized_shape: Sequence[int],
    weight: Tensor | None,
    eps: float | None,
    cast: CastMode = "fp32",
    zero_centered: bool = False,
) -> Tensor:
    """RMSNorm with the cast order of ``cast`` (see ``RMSNormSpec``); ``eps=None``: see ``resolve_rms_eps``.

    ``"fp32"`` equals ``F.rms_norm`` bit for bit where weight and input share a dtype (tested), and is op for op
    ``Olmo2RMSNorm`` and (with ``zero_centered``) ``GemmaRMSNorm``; ``"llama"`` is ``LlamaRMSNorm``; ``"t5"`` is
    ``T5LayerNorm``.
    """
    eps = resolve_rms_eps(eps, x.dtype)
    dims = _reduce_dims(normalized_shape)
    h = x.to(compute_dtype(x.dtype))
    if cast == "t5":
        # T5LayerNorm multiplies the *uncast* input by the fp32 rsqrt (promotion does the upcast), so autograd
        # sums two half-precision grads for x; written the same way to match its backward bit for bit.
        h = x * torch.rsqrt(h.pow(2).mean(dims, keepdim=True) + eps)
    else:
        h = h * torch.rsqrt(h.pow(2).mean(dims, keepdim=True) + eps)
    if cast == "fp32":
        if weight is not None:
            w = weight.to(torch.promote_types(h.dtype, weight.dtype))
            h = h * (1.0 + w if zero_centered else w)
        return h.to(x.dtype)
    if cast == "llama":
        h = h.to(x.dtype)
        return h if weight is None else weight * h
    if cast == "t5":
        if weight is None:
            return h.to(x.dtype)
        if weight.dtype in _HALF:
            h = h.to(weight.dtype)
        return weight * h
    raise ValueError(f"cast must be one of 'fp32', 'llama', 't5', got {cast!r}")


def dyt(x: Tensor, alpha: Tensor, weight: Tensor | None, bias: Tensor | None) -> Tensor:
    """Dynamic Tanh (Zhu et al. 2025): ``weight * tanh(alpha * x) + bias``, in fp32, one cast at the end."""
    cdt = compute_dtype(x.dtype)
    h = torch.tanh(alpha.to(cdt) * x.to(cdt))
    if weight is not None:
        h = h * weight.to(cdt)
    if bias is not None:
        h = h + bias.to(cdt)
    return h.to(x.dtype)


def scale_norm(x: Tensor, normalized_shape: Sequence[int], scale: Tensor, eps: float) -> Tensor:
    """ScaleNorm (Nguyen & Salazar 2019): ``scale * x / max(||x||_2, eps)`` over the normalised dims, in fp32."""
    cdt = compute_dtype(x.dtype)
    h = x.to(cdt)
    dims = tuple(range(-len(normalized_shape), 0))
    norm = torch.linalg.vector_norm(h, ord=2, dim=dims, keepdim=True).clamp_min(eps)
    return (h * (scale.to(cdt) / norm)).to(x.dtype)
