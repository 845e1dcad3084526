"""Which dtypes a fused call uses, derived from the spec and the operands exactly as the eager path derives them.

The eager convention (``lnblocks.norms.modules.Norm.forward``): ``new_residual = add_residual(x, r)`` (fp32 when
``residual_in_fp32``, else type promotion); ``y = norm(new_residual)`` computed on the rounded new residual; with
``residual_in_fp32`` the output is cast back to what ``norm(x)`` would return. The HF cast orders
(``lnblocks.norms.functional.rms_norm``) become a rounding of x_hat before the weight multiply.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from lnblocks.norms.functional import compute_dtype
from lnblocks.norms.spec import LayerNormSpec, RMSNormSpec

_HALF = (torch.float16, torch.bfloat16)

ROUND_NONE, ROUND_TO_INPUT, ROUND_TO_WEIGHT = 0, 1, 2


@dataclass(frozen=True)
class KernelPlan:
    """Dtypes and constants of one fused call.

    ``norm_dtype``: dtype of the tensor the norm sees (the new residual, or x). ``round_mode``: 0 none,
    1 round x_hat to ``norm_dtype`` before the weight (``LlamaRMSNorm``), 2 round it to the weight's dtype
    (``T5LayerNorm`` with a half-precision weight).
    """

    residual_dtype: torch.dtype | None
    norm_dtype: torch.dtype
    out_dtype: torch.dtype
    round_mode: int
    eps: float
    is_rms: bool


def eager_output_dtype(
    spec: LayerNormSpec | RMSNormSpec, input_dtype: torch.dtype, weight_dtype: torch.dtype | None
) -> torch.dtype:
    """The dtype ``norm(x)`` returns for an input of ``input_dtype`` (``Norm.output_dtype`` without a module)."""
    if spec.kind == "layernorm" or weight_dtype is None or spec.cast == "fp32":
        return input_dtype
    if spec.cast == "llama":
        return torch.promote_types(weight_dtype, input_dtype)
    if weight_dtype in _HALF:  # t5
        return weight_dtype
    return torch.promote_types(compute_dtype(input_dtype), weight_dtype)


@functools.lru_cache(maxsize=1024)
def make_plan(
    spec: LayerNormSpec | RMSNormSpec,
    x_dtype: torch.dtype,
    residual_dtype: torch.dtype | None,
    weight_dtype: torch.dtype | None,
    out_dtype: torch.dtype | None = None,
) -> KernelPlan:
    """Resolve the dtypes of a call; ``out_dtype=None`` picks what the eager module returns."""
    is_rms = spec.kind == "rmsnorm"
    res_dtype = None
    if residual_dtype is not None:
        res_dtype = torch.float32 if spec.residual_in_fp32 else torch.promote_types(x_dtype, residual_dtype)
    norm_dtype = res_dtype or x_dtype
    if out_dtype is None:
        base = x_dtype if (res_dtype is not None and spec.residual_in_fp32) else norm_dtype
        out_dtype = eager_output_dtype(spec, base, weight_dtype)
    round_mode = ROUND_NONE
    if is_rms and weight_dtype is not None:
        if spec.cast == "llama" and norm_dtype != torch.float32:
            round_mode = ROUND_TO_INPUT
        elif spec.cast == "t5" and weight_dtype in _HALF:
            round_mode = ROUND_TO_WEIGHT
    eps = spec.eps if spec.eps is not None else torch.finfo(norm_dtype).eps
    return KernelPlan(res_dtype, norm_dtype, out_dtype, round_mode, float(eps), is_rms)
