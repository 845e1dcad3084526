"""Filter Response Normalization and the Thresholded Linear Unit (Singh & Krishnan 2019, arXiv 1911.09737).

FRN normalises each ``(n, c)`` feature map by its mean square, with no mean subtraction and no batch statistics
(so no train/eval difference and no batch-size dependence):

    nu2 = mean_{H,W} x^2,    y = weight * x / sqrt(nu2 + eps_total) + bias

TLU is ``z = max(y, tau)`` with a learned per-channel threshold. The paper always pairs them --
``nn.Sequential(FRN2d(C), TLU(C))`` in place of BatchNorm + ReLU -- because without mean centering a plain ReLU
after FRN can leave a whole channel at zero.

``eps_total`` is ``eps`` (the paper's 1e-6). With ``learnable_eps=True`` it is ``eps + |eps_learned|``, a learned
scalar added to the fixed floor ``eps``; the paper learns epsilon where the maps are 1x1 (fully connected layers),
since there ``x / sqrt(x^2 + eps)`` is nearly a sign function. ``eps_learned`` starts at 1e-4 (our choice: it has
to start away from 0, where ``|.|`` passes no gradient).

``eps = 0`` is allowed: an all-zero map (mean square 0) then gives ``y = bias`` (the normalised value 0, the limit
of ``0 / sqrt(eps)``), not NaN; any other map gives ``x / rms(x)``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from lnblocks.cnn._base import (
    check_eps,
    check_flags,
    check_input,
    check_num_features,
    empty_output,
    register_affine,
    reset_affine,
)
from lnblocks.cnn.functional import channel_view, compute_dtype, rsqrt_or_zero

EPS_LEARNED_INIT = 1e-4


class FRN2d(nn.Module):
    """Filter Response Normalization over ``(N, C, H, W)``: Parameters ``weight`` (1), ``bias`` (0), per channel,
    and ``eps_learned`` (a scalar) when ``learnable_eps``."""

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-6,
        learnable_eps: bool = False,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.num_features = check_num_features("num_features", num_features)
        self.eps = check_eps(eps)
        check_flags(learnable_eps=learnable_eps)
        self.learnable_eps = learnable_eps
        factory = {"device": device, "dtype": dtype}
        register_affine(self, num_features, True, True, factory)
        self.register_parameter("eps_learned", nn.Parameter(torch.empty(1, **factory)) if learnable_eps else None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Weight 1, bias 0, learned epsilon 1e-4."""
        reset_affine(self)
        if self.eps_learned is not None:
            nn.init.constant_(self.eps_learned, EPS_LEARNED_INIT)

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, learnable_eps={self.learnable_eps}"

    def forward(self, x: Tensor) -> Tensor:
        check_input(self, x, (4,), "(N, C, H, W)")
        if x.numel() == 0:  # zero-size rule (the mean square of an empty map is NaN, and so would eps's grad be)
            return empty_output(x, self.weight, self.bias, self.eps_learned)
        cdt = compute_dtype(x.dtype)
        h = x.to(cdt)
        nu2 = h.square().mean((2, 3), keepdim=True)  # (N, C, 1, 1)
        eps = self.eps if self.eps_learned is None else self.eps + self.eps_learned.to(cdt).abs()
        inv = torch.rsqrt(nu2 + eps) if self.eps > 0 else rsqrt_or_zero(nu2 + eps)  # eps = 0: an all-zero map -> 0
        y = h * inv * channel_view(self.weight.to(cdt), 4) + channel_view(self.bias.to(cdt), 4)
        return y.to(x.dtype)


class TLU(nn.Module):
    """Thresholded Linear Unit ``max(x, tau)`` over ``(N, C, *)``, ``tau`` per channel (a Parameter, initially 0,
    i.e. ReLU). The activation the paper pairs with ``FRN2d``."""

    def __init__(self, num_features: int, device: Any = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.num_features = check_num_features("num_features", num_features)
        self.tau = nn.Parameter(torch.empty(num_features, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """tau = 0."""
        nn.init.zeros_(self.tau)

    def extra_repr(self) -> str:
        return f"{self.num_features}"

    def forward(self, x: Tensor) -> Tensor:
        check_input(self, x, (2, 3, 4, 5), "(N, C, *)")
        return torch.maximum(x, channel_view(self.tau, x.dim()).to(x.dtype))
