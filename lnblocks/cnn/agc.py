"""Unit-wise Adaptive Gradient Clipping (Brock, De, Smith & Simonyan 2021, arXiv 2102.06171, Sec. 4), the clipping
that lets NFNets train at large batch sizes without normalization layers.

For each unit ``i`` of a parameter (its gradient ``G_i`` and weights ``W_i``), with ``lambda = clipping``:

    G_i <- G_i * lambda * max(|W_i|, eps) / |G_i|      if |G_i| / max(|W_i|, eps) > lambda,   else unchanged

(Frobenius norms). A unit is a slice along dim 0, the output unit of ``nn.Linear`` ``(out, in)`` and
``nn.Conv*d`` ``(out, in/groups, *k)`` weights (a row, a filter); a parameter with 0 or 1 dims (biases, gains, norm
weights) is one unit as a whole, as in the authors' code. ``eps`` (1e-3) keeps zero-initialised weights from
freezing their gradients. The paper does not clip the final classifier layer: leave its parameters out. Transposed
convolutions keep their *input* channels in dim 0, so their units are per input channel here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor

from lnblocks.cnn.functional import compute_dtype


def _unitwise_norm(t: Tensor) -> Tensor:
    """Norm per slice of dim 0, ``(out, 1, ...)``; the whole norm (0-d) for tensors of at most 1 dim."""
    if t.dim() <= 1:
        return torch.linalg.vector_norm(t)
    return torch.linalg.vector_norm(t, dim=tuple(range(1, t.dim())), keepdim=True)


def _positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


@torch.no_grad()
def adaptive_grad_clip_(parameters: Tensor | Iterable[Tensor], clipping: float = 0.01, eps: float = 1e-3) -> None:
    """Clip the ``.grad`` of each of ``parameters`` in place, unit-wise (see the module docstring).

    Parameters without a gradient are skipped. Norms are computed in ``promote(dtype, float32)``; the clipped gradient
    is written back in its own dtype.
    """
    clipping = _positive("clipping", clipping)
    eps = _positive("eps", eps)
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    for i, p in enumerate(params):
        if not isinstance(p, Tensor):
            raise TypeError(f"parameters[{i}] must be a torch.Tensor, got {type(p).__name__}")
        if p.grad is None:
            continue
        if p.grad.is_sparse:
            raise ValueError(f"parameters[{i}]: adaptive_grad_clip_ does not support sparse gradients")
        cdt = compute_dtype(p.dtype)
        g = p.grad.to(cdt)
        max_norm = _unitwise_norm(p.detach().to(cdt)).clamp_min(eps) * clipping
        g_norm = _unitwise_norm(g)
        scale = torch.where(g_norm > max_norm, max_norm / g_norm.clamp_min(1e-6), torch.ones_like(g_norm))
        p.grad.copy_(g * scale)
