"""``fused_norm``: runs a ``lnblocks.norms`` module's math with the fused kernel (its ``backend="triton"``)."""

from __future__ import annotations

import torch
from torch import Tensor

from lnblocks.kernels.functional import fused_add_norm


def fused_norm(module, x: Tensor, residual: Tensor | None) -> Tensor | tuple[Tensor, Tensor]:
    """``module(x)`` -> ``y``, ``module(x, residual)`` -> ``(y, new_residual)``, as the eager path returns them.

    ``module`` is a ``lnblocks.norms.LayerNorm`` or ``RMSNorm``; its spec, parameters and ``normalized_shape`` are
    used as they are, and the output dtype is the module's own ``output_dtype`` rule.
    """
    spec = module.spec
    weight = module.weight
    bias = getattr(module, "bias", None)
    # The dtype the eager norm sees: x, or the promoted new residual (with residual_in_fp32 eager casts y back to
    # what norm(x) returns).
    base = x.dtype if residual is None or spec.residual_in_fp32 else torch.promote_types(x.dtype, residual.dtype)
    return fused_add_norm(
        x, residual, weight, bias, spec, normalized_shape=module.normalized_shape, out_dtype=module.output_dtype(base)
    )
