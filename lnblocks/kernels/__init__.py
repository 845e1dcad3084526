"""Fused Triton norm kernels (forward and backward, residual and dropout fused): what they support, and entry points.

Nothing here touches CUDA or imports triton at import time: ``lnblocks.norms`` modules import this package lazily,
and the kernel modules load on first use. The layout is flash-attn's / Liger's, one way from top to bottom:

- reference math: ``lnblocks.norms.functional`` (what the kernels must equal);
- ``plan``: what the kernels can run (the support rule) and ``NormPlan``, every non-tensor argument of a call,
  resolved once (no triton);
- ``jit_helpers``, ``jit``: the Triton kernels' shared device helpers, and the kernels (device code only);
- ``launch``: launch shapes from N, argument lists, grids, the launchers;
- ``ops``: the one autograd / ``torch.library`` custom-op layer;
- ``run``: the hot path, ``run_fused`` (planned calls, DTensor shards, the memory-efficient backward's weight rule);
- ``functional``: the validated entry points, ``fused_add_norm``, ``fused_norm_then_add``, ``fused_gated_rms_norm``
  and ``dropout_mask``.

Public API: ``fused_add_norm``, ``fused_norm_then_add``, ``fused_gated_rms_norm``, ``dropout_mask``,
``unavailable_reason``; custom ops ``torch.ops.lnblocks.norm_fwd`` / ``norm_bwd`` / ``norm_bwd_inplace``.
"""

from __future__ import annotations

from typing import Any

from lnblocks.kernels.plan import (
    FUSED_KINDS,
    KERNEL_DTYPES,
    device_unavailable_reason,
    interpreter_enabled,
    is_dtensor,
    sharding_unavailable_reason,
    triton_installed,
    unavailable_reason,
)


def __getattr__(name: str) -> Any:  # lazy public names: importing them loads triton
    if name in ("fused_add_norm", "fused_norm_then_add", "fused_gated_rms_norm", "run_fused", "dropout_mask"):
        from lnblocks.kernels import functional

        return getattr(functional, name)
    raise AttributeError(f"module 'lnblocks.kernels' has no attribute {name!r}")


__all__ = [
    "FUSED_KINDS",
    "KERNEL_DTYPES",
    "device_unavailable_reason",
    "dropout_mask",
    "fused_add_norm",
    "fused_gated_rms_norm",
    "fused_norm_then_add",
    "interpreter_enabled",
    "is_dtensor",
    "sharding_unavailable_reason",
    "triton_installed",
    "unavailable_reason",
]
