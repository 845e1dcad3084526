"""Fused Triton norm kernels (forward and backward, residual and dropout fused): what they support, and entry points.

Nothing here touches CUDA or imports triton at import time: ``lnblocks.norms`` modules import this package lazily,
and the kernel modules load on first use. The layout is flash-attn's / Liger's: reference math
(``lnblocks.norms.functional``), Triton kernels with their launchers (``forward``, ``backward``, ``dropout``), one
autograd/custom-op layer (``ops``), the entry points (``functional``), with every non-tensor argument carried by one
``NormPlan`` (``plan``).

Public API: ``fused_add_norm`` (``lnblocks.kernels.functional``), ``dropout_mask``, ``unavailable_reason``; custom
ops ``torch.ops.lnblocks.norm_fwd`` / ``norm_bwd`` / ``norm_bwd_inplace``.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from lnblocks.norms.spec import NormSpec

KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FUSED_KINDS = ("layernorm", "rmsnorm")
_TRITON_INSTALLED = importlib.util.find_spec("triton") is not None  # a file-system lookup, no import


def triton_installed() -> bool:
    return _TRITON_INSTALLED


def interpreter_enabled() -> bool:
    """True under ``TRITON_INTERPRET=1``: kernels then run on CPU tensors (slowly; this is how tests run them)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def device_unavailable_reason(x: Tensor, name: str = "x") -> str | None:
    """Why the kernels cannot run on ``x``'s device (None when they can)."""
    if not x.is_cuda and not interpreter_enabled():
        return (
            f"{name} is on {x.device.type}: the Triton kernels run on CUDA tensors, or on CPU only under "
            "TRITON_INTERPRET=1"
        )
    return None


def unavailable_reason(
    spec: NormSpec,
    x: Tensor,
    name: str = "x",
    *,
    residual: Tensor | None = None,
    parameters: Iterable[tuple[str, Tensor]] = (),
) -> str | None:
    """Why the fused kernel cannot run ``spec`` on ``x`` (and ``residual``, and the module's ``parameters``), or
    None when it can; ``name`` is how messages call ``x``. The one home of the kernel-support rule."""
    if spec.kind not in FUSED_KINDS:
        return f"there is no fused kernel for norm kind {spec.kind!r}"
    if not _TRITON_INSTALLED:
        return "triton is not installed (pip install triton; Linux only)"
    for label, t in ((name, x), ("residual", residual)):
        if t is None:
            continue
        reason = device_unavailable_reason(t, label)
        if reason is not None:
            return reason
        if t.dtype not in KERNEL_DTYPES:
            return f"{label} is {t.dtype}; the kernels take float16, bfloat16 or float32"
    for label, p in parameters:
        if p.dtype not in KERNEL_DTYPES:
            return f"{label} is {p.dtype}; the kernels take float16, bfloat16 or float32 parameters"
    return None


def __getattr__(name: str) -> Any:  # lazy public names: importing them loads triton
    if name == "fused_add_norm":
        from lnblocks.kernels.functional import fused_add_norm

        return fused_add_norm
    if name == "run_fused":
        from lnblocks.kernels.functional import run_fused

        return run_fused
    if name == "dropout_mask":
        from lnblocks.kernels.dropout import dropout_mask

        return dropout_mask
    raise AttributeError(f"module 'lnblocks.kernels' has no attribute {name!r}")


__all__ = ["dropout_mask", "fused_add_norm", "interpreter_enabled", "unavailable_reason"]
