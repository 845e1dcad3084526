"""Module-level kernel checks: the same norm built three times (``backend="triton"``, ``backend="torch"`` in the same
dtype, and in fp64: the reference math run in fp64) with the same non-trivial parameters, called the same way; the
kernel passes when every output and every gradient satisfies flash-attn's rule against the fp64 run,
``err(kernel) <= 2 * err(eager) + atol``. Parameter gradients are sums over rows: their atol grows with sqrt(rows),
and a scalar's (DyT/Derf's alpha, shift) with sqrt(elements) (quack's rule)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from lnblocks.norms import Norm, build_norm
from tests.kernels.kernel_helpers import ATOL, DEVICE, assert_close_to_fp64

Call = Callable[..., Tensor | tuple[Tensor, ...]]


def triple(preset: str, shape: int | Sequence[int], dtype: torch.dtype, scale: float = 0.3, **options) -> list[Norm]:
    """``[triton, torch, fp64]`` modules of ``preset`` with the same randomised parameters."""
    modules = [
        build_norm(preset, shape, backend=backend, dtype=dt, device=DEVICE, **options)
        for backend, dt in (("triton", dtype), ("torch", dtype), ("torch", torch.float64))
    ]
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in modules[1].parameters():
            p.add_((torch.randn(p.shape, generator=gen) * scale).to(device=DEVICE, dtype=p.dtype))
    for m in (modules[0], modules[2]):
        m.load_state_dict(modules[1].state_dict())
    return modules


def run(module: Norm, call: Call, inputs: Sequence[Tensor | None], seed: int = 1) -> tuple[list, list]:
    """Outputs of ``call(module, *inputs)`` and the gradients of a fixed random fp64 loss w.r.t. every input and
    parameter (in ``named_parameters`` order)."""
    leaves = [None if t is None else t.detach().clone().requires_grad_() for t in inputs]
    out = call(module, *leaves)
    outs = [o for o in (out if isinstance(out, tuple) else (out,)) if o.numel()]
    gen = torch.Generator().manual_seed(seed)
    loss = sum((o.double() * torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.device)).sum() for o in outs)
    wrt = [t for t in leaves if t is not None] + [p for _, p in sorted(module.named_parameters())]
    return outs, list(torch.autograd.grad(loss, wrt))


def check_call(
    preset: str,
    shape: int | Sequence[int],
    dtype: torch.dtype,
    call: Call,
    inputs: Sequence[Tensor | None],
    **options,
) -> list[Norm]:
    """Kernel vs eager vs fp64 for ``call`` on ``inputs`` (in ``dtype``); returns the three modules."""
    modules = triple(preset, shape, dtype, **options)
    runs = [run(m, call, inputs if m is not modules[2] else [_fp64(t) for t in inputs]) for m in modules]
    assert modules[0].last_backend == "triton" and modules[1].last_backend == "torch"
    (o_k, g_k), (o_t, g_t), (o_64, g_64) = runs
    atol = ATOL[dtype]
    for i, (a, b, c) in enumerate(zip(o_k, o_t, o_64, strict=True)):
        assert a.dtype == b.dtype and a.shape == b.shape, f"output {i}: {a.dtype} {a.shape} vs {b.dtype} {b.shape}"
        assert_close_to_fp64(f"output {i}", a, b, c, atol)
    x = next(t for t in inputs if t is not None)
    rows = x.numel() // math.prod(modules[0].normalized_shape)
    for i, (a, b, c) in enumerate(zip(g_k, g_t, g_64, strict=True)):
        assert a.dtype == b.dtype, f"grad {i}: {a.dtype} vs {b.dtype}"
        scale = math.sqrt(x.numel()) if a.numel() == 1 else math.sqrt(rows) if a.dim() < x.dim() else 1.0
        assert_close_to_fp64(f"grad {i}", a, b, c, atol * scale)
    return modules


def _fp64(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.double()


def randn(*shape: int, dtype: torch.dtype, scale: float = 1.0, offset: float = 0.0) -> Tensor:
    return (torch.randn(*shape, device=DEVICE) * scale + offset).to(dtype)
