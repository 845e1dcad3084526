"""Fused Triton norm kernels (forward and backward, residual and dropout fused): what they support, and entry points.

Nothing here touches CUDA or imports triton at import time: ``lnblocks.norms`` modules import this package lazily,
and the kernel modules load on first use. The layout is flash-attn's / Liger's, one way from top to bottom:

- reference math: ``lnblocks.norms.functional`` (what the kernels must equal);
- ``plan``: ``NormPlan``, every non-tensor argument of a call, resolved once (no triton);
- ``jit``: the Triton kernels (device code only);
- ``launch``: launch shapes from N, argument lists, grids, the launchers;
- ``ops``: the one autograd / ``torch.library`` custom-op layer;
- ``functional``: the entry points, ``fused_add_norm``, ``run_fused`` and ``dropout_mask``.

This file holds the support rule (``unavailable_reason``, ``sharding_unavailable_reason``). Public API:
``fused_add_norm``, ``dropout_mask``, ``unavailable_reason``; custom ops ``torch.ops.lnblocks.norm_fwd`` /
``norm_bwd`` / ``norm_bwd_inplace``.
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from lnblocks.norms.spec import NormSpec

KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FUSED_KINDS = ("layernorm", "rmsnorm")
_TRITON_INSTALLED = importlib.util.find_spec("triton") is not None  # a file-system lookup, no import
_PLAIN_TYPES = (Tensor, torch.nn.Parameter)


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


def is_dtensor(t: object) -> bool:
    """``t`` is a ``torch.distributed.tensor.DTensor`` (imported only when a tensor subclass shows up)."""
    if t is None or type(t) in _PLAIN_TYPES or not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def sharding_unavailable_reason(
    x: Tensor, residual: Tensor | None, parameters: Iterable[tuple[str, Tensor | None]], n: int
) -> str | None:
    """Why the kernels cannot run a call with DTensor operands on each rank's local rows (None when they can).

    They can when every row is whole on one rank: ``x`` sharded on leading (batch or sequence) dims or replicated,
    ``n`` = elements per row, the parameters replicated on x's mesh and the residual a DTensor on that mesh. An input
    sharded on a normalised dim is refused rather than gathered (the statistics would need an all-reduce the kernels
    do not do); so is a ``Partial`` (pending-sum) input, which must be reduced before a non-linear op.
    """
    if not is_dtensor(x):
        sharded = next((label for label, t in (("residual", residual), *parameters) if is_dtensor(t)), None)
        if sharded is None:
            return None
        return (
            f"{sharded} is a DTensor but x is a plain tensor. A norm under FSDP2 must be called as a module, "
            "norm(x), not norm.forward(x): its all-gather runs in __call__'s hooks (pytorch#157209)"
        )
    mesh = x.device_mesh
    k = _row_dims(tuple(x.shape), n)
    for i, p in enumerate(x.placements):
        if p.is_partial():
            return (
                f"x is Partial on mesh dim {i} (a pending sum): reduce it first, e.g. "
                "x.redistribute(placements=[Shard(1)]), or use backend='torch'"
            )
        if p.is_shard() and p.dim % x.dim() >= x.dim() - k:
            return (
                f"x is sharded on dim {p.dim % x.dim()}, a normalised dim of shape {tuple(x.shape)}: each rank "
                "needs whole rows. Shard the batch or sequence dim (SequenceParallel: Shard(1)), or use "
                "backend='torch'"
            )
    for label, t in (("residual", residual), *parameters):
        if t is None:
            continue
        if not is_dtensor(t):
            return (
                f"{label} is a plain tensor while x is a DTensor: distribute it on x's mesh too (for a norm module: "
                "parallelize_module(norm, mesh, SequenceParallel()) replicates its parameters)"
            )
        if t.device_mesh != mesh:
            return f"{label} is on another device mesh than x ({t.device_mesh} vs {mesh})"
        if label != "residual" and not all(p.is_replicate() for p in t.placements):
            return (
                f"{label} has placements {tuple(t.placements)}: a norm's parameters must be replicated where it runs "
                "(FSDP2 gathers them in the module's __call__; under tensor parallelism use SequenceParallel)"
            )
    return None


def _row_dims(shape: tuple[int, ...], n: int) -> int:
    """How many trailing dims of ``shape`` hold one row of ``n`` elements (the fewest that do)."""
    for k in range(1, len(shape) + 1):
        if math.prod(shape[-k:]) == n:
            return k
    return len(shape)


def unavailable_reason(
    spec: NormSpec,
    x: Tensor,
    name: str = "x",
    *,
    residual: Tensor | None = None,
    parameters: Iterable[tuple[str, Tensor]] = (),
    row_numel: int | None = None,
) -> str | None:
    """Why the fused kernel cannot run ``spec`` on ``x`` (and ``residual``, and the module's ``parameters``), or
    None when it can; ``name`` is how messages call ``x``, ``row_numel`` the elements per row (default: the last
    dim). The one home of the kernel-support rule."""
    if spec.kind not in FUSED_KINDS:
        return f"there is no fused kernel for norm kind {spec.kind!r}"
    if not _TRITON_INSTALLED:
        return "triton is not installed (pip install triton; Linux only)"
    parameters = list(parameters)
    for label, t in ((name, x), ("residual", residual)):
        if t is None:
            continue
        reason = device_unavailable_reason(t, label)
        if reason is not None:
            return reason
        if t.dtype not in KERNEL_DTYPES:
            return f"{label} is {t.dtype}; the kernels take float16, bfloat16 or float32"
    for label, p in parameters:
        if p is not None and p.dtype not in KERNEL_DTYPES:
            return f"{label} is {p.dtype}; the kernels take float16, bfloat16 or float32 parameters"
    if any(is_dtensor(t) for t in (x, residual, *(p for _, p in parameters))):
        n = row_numel if row_numel is not None else (x.shape[-1] if x.dim() else 1)
        return sharding_unavailable_reason(x, residual, parameters, n)
    return None


def __getattr__(name: str) -> Any:  # lazy public names: importing them loads triton
    if name in ("fused_add_norm", "run_fused", "dropout_mask"):
        from lnblocks.kernels import functional

        return getattr(functional, name)
    raise AttributeError(f"module 'lnblocks.kernels' has no attribute {name!r}")


__all__ = ["dropout_mask", "fused_add_norm", "interpreter_enabled", "unavailable_reason"]
