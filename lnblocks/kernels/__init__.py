"""Fused Triton norm kernels (forward and backward, residual fused) and their dispatch.

Nothing here touches CUDA or imports triton at import time.
"""

from __future__ import annotations

import functools
import importlib.util
import os

from torch import Tensor

from lnblocks.norms.spec import NormSpec


@functools.cache
def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def interpreter_enabled() -> bool:
    """True under ``TRITON_INTERPRET=1``: kernels then run on CPU tensors (slowly; this is how tests run them)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def unavailable_reason(spec: NormSpec, x: Tensor) -> str | None:
    """Why the fused kernel cannot run ``spec`` on ``x``, or None when it can."""
    if spec.kind not in ("layernorm", "rmsnorm"):
        return f"there is no fused kernel for norm kind {spec.kind!r}"
    if not triton_installed():
        return "triton is not installed (pip install triton; Linux only)"
    if not x.is_cuda and not interpreter_enabled():
        return f"x is on {x.device.type}; Triton kernels run on CUDA tensors (or on CPU under TRITON_INTERPRET=1)"
    return "the fused Triton kernels are not implemented yet"


def fused_norm(module, x: Tensor, residual: Tensor | None):  # pragma: no cover - replaced by the kernel issue
    raise NotImplementedError("the fused Triton kernels are not implemented yet")
