"""Fused Triton norm kernels (forward and backward, residual and dropout fused) and their dispatch.

Nothing here touches CUDA or imports triton at import time: ``lnblocks.norms`` modules import this package lazily
(``unavailable_reason``, ``fused_norm``), and the kernel modules load on first use.

Public API: ``fused_add_norm`` (``lnblocks.kernels.functional``), ``dropout_mask``, ``fused_norm(module, x, residual)``,
``unavailable_reason(spec, x)``; custom ops ``torch.ops.lnblocks.norm_fwd`` / ``norm_bwd`` / ``norm_bwd_inplace``.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import torch
from torch import Tensor

from lnblocks.norms.spec import NormSpec

_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_TRITON_INSTALLED = importlib.util.find_spec("triton") is not None  # a file-system lookup, no import


def triton_installed() -> bool:
    return _TRITON_INSTALLED


def interpreter_enabled() -> bool:
    """True under ``TRITON_INTERPRET=1``: kernels then run on CPU tensors (slowly; this is how tests run them)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def unavailable_reason(spec: NormSpec, x: Tensor, name: str = "x") -> str | None:
    """Why the fused kernel cannot run ``spec`` on ``x``, or None when it can; ``name`` is how messages call ``x``."""
    if spec.kind not in ("layernorm", "rmsnorm"):
        return f"there is no fused kernel for norm kind {spec.kind!r}"
    if not _TRITON_INSTALLED:
        return "triton is not installed (pip install triton; Linux only)"
    if not x.is_cuda and not interpreter_enabled():
        return f"{name} is on {x.device.type}; Triton kernels run on CUDA tensors (or on CPU under TRITON_INTERPRET=1)"
    if x.dtype not in _KERNEL_DTYPES:
        return f"{name} is {x.dtype}; the kernels take float16, bfloat16 or float32"
    return None


def fused_norm(module: Any, x: Tensor, residual: Tensor | None) -> Tensor | tuple[Tensor, Tensor]:
    """Run ``module`` (a ``lnblocks.norms`` LayerNorm/RMSNorm) with the fused kernel; returns what eager returns."""
    from lnblocks.kernels.dispatch import fused_norm as _fused_norm

    return _fused_norm(module, x, residual)


def __getattr__(name: str) -> Any:  # lazy public names: importing them loads triton
    if name == "fused_add_norm":
        from lnblocks.kernels.functional import fused_add_norm

        return fused_add_norm
    if name == "dropout_mask":
        from lnblocks.kernels.dropout import dropout_mask

        return dropout_mask
    raise AttributeError(f"module 'lnblocks.kernels' has no attribute {name!r}")


__all__ = ["dropout_mask", "fused_add_norm", "fused_norm", "interpreter_enabled", "unavailable_reason"]
