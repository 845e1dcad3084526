"""Shared helpers for norm tests: forward+backward runs and fp64-referenced error bounds."""

from __future__ import annotations

import torch
from torch import Tensor, nn

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# Rows of odd sizes: 1-element rows, primes, a power of two, a size above 4096.
SIZES = [1, 7, 64, 1000, 4097]


def run_fwd_bwd(module: nn.Module, x: Tensor, grad_out: Tensor | None = None, **kwargs) -> tuple[Tensor, list[Tensor]]:
    """Output and grads w.r.t. ``x`` and every parameter (in ``named_parameters`` order)."""
    x = x.detach().requires_grad_(True)
    y = module(x, **kwargs)
    if grad_out is None:
        grad_out = torch.randn_like(y)
    params = [p for _, p in sorted(module.named_parameters())]
    grads = torch.autograd.grad(y, [x, *params], grad_out)
    return y, list(grads)


def copy_params(src: nn.Module, dst: nn.Module) -> None:
    """Load ``src``'s state into ``dst`` strictly (also proves the keys match)."""
    dst.load_state_dict(src.state_dict(), strict=True)


def randomize_(module: nn.Module, scale: float = 0.5) -> nn.Module:
    """Non-trivial parameters, so that a wrong cast order or a missing ``1 + w`` shows."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * scale)
    return module
