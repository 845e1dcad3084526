"""EvoNorm-B0 and EvoNorm-S0 (Liu, Brock, Simonyan & Le 2020, arXiv 2004.02967): normalization and activation in
one layer, found by architecture search. For ``x`` of shape ``(N, C, H, W)``, with ``std(x) = sqrt(var(x) + eps)``:

    B0:  y = x / max(std_batch(x), v * x + std_instance(x)) * weight + bias
    S0:  y = x * sigmoid(v * x) / std_group(x) * weight + bias

``std_batch`` is over ``(N, H, W)`` per channel, ``std_instance`` over ``(H, W)`` per ``(n, c)``, ``std_group``
over the ``(C/G, H, W)`` of each group of a sample, as GroupNorm's. ``weight`` (1), ``bias`` (0) and ``v`` (1) are
per-channel Parameters. The conventions are those of the authors' reference TensorFlow code (the EvoNorm layers of
the ResNet model in tensorflow/tpu): every variance is biased (``tf.nn.moments``), ``eps = 1e-5`` inside the square
root, and B0's running variance, initialised to 1, moves towards the *biased* batch variance (``decay = 0.9``, i.e.
our ``momentum = 0.1``, the weight of the new batch) -- unlike BatchNorm's unbiased one. B0 uses it in eval mode; S0
has no batch statistics, so it does not depend on the batch size and trains and evaluates alike.

Groups of S0: ``G`` is the largest divisor of ``C`` that is at most ``groups`` (the reference code's rule:
``groups=32`` gives 32 groups for C = 64, 16 for C = 16, 24 for C = 48, 1 for a prime C above 32); the attribute
``num_groups`` holds the ``G`` in use.

``eps`` must be > 0 (unlike the centred norms of the family, ``x / std`` has no finite limit on a constant map as
``eps -> 0``). An empty input (N = 0 or a zero-size spatial dim) gives an empty output and leaves B0's running
variance as it was.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from lnblocks.cnn._base import (
    check_eps,
    check_input,
    check_momentum,
    check_num_features,
    empty_output,
    register_affine,
)
from lnblocks.cnn.functional import channel_view, compute_dtype


class _EvoNorm(nn.Module):
    """Shared Parameters (``weight``, ``bias``, ``v``) and checks."""

    def __init__(self, num_features: int, eps: float, device: Any, dtype: torch.dtype | None) -> None:
        super().__init__()
        self.num_features = check_num_features("num_features", num_features)
        self.eps = check_eps(eps)
        if self.eps == 0:
            raise ValueError(
                f"eps must be > 0 for {type(self).__name__}: its numerator is not centred, so with eps = 0 a "
                "constant map divides a non-zero value by 0"
            )
        factory = {"device": device, "dtype": dtype}
        register_affine(self, num_features, True, True, factory)
        self.v = nn.Parameter(torch.empty(num_features, **factory))

    def reset_parameters(self) -> None:
        """weight 1, bias 0, v 1."""
        nn.init.ones_(self.weight)
        nn.init.zeros_(self.bias)
        nn.init.ones_(self.v)

    def _params(self, cdt: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
        """``weight``, ``bias``, ``v`` as ``(1, C, 1, 1)`` in ``cdt``."""
        return tuple(channel_view(p.to(cdt), 4) for p in (self.weight, self.bias, self.v))  # type: ignore[return-value]


class EvoNormB0(_EvoNorm):
    """EvoNorm-B0 over ``(N, C, H, W)``: batch-dependent, with a running variance (buffer ``running_var``) for eval."""

    def __init__(
        self,
        num_features: int,
        momentum: float = 0.1,
        eps: float = 1e-5,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(num_features, eps, device, dtype)
        self.momentum = check_momentum(momentum, allow_none=False)
        self.register_buffer("running_var", torch.empty(num_features, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """weight 1, bias 0, v 1, running variance 1."""
        super().reset_parameters()
        self.reset_running_stats()

    def reset_running_stats(self) -> None:
        """Running variance 1 (the reference code's initial value)."""
        nn.init.ones_(self.running_var)

    def extra_repr(self) -> str:
        return f"{self.num_features}, momentum={self.momentum}, eps={self.eps}"

    def forward(self, x: Tensor) -> Tensor:
        check_input(self, x, (4,), "(N, C, H, W)")
        n, _, h, w = x.shape
        if self.training and n * h * w == 1:
            raise ValueError(
                f"x: EvoNormB0 needs more than 1 value per channel (over batch and spatial dims) to compute the batch "
                f"variance in training mode, got shape {tuple(x.shape)}; use a larger input or eval mode"
            )
        if x.numel() == 0:  # zero-size rule: an empty output, the running variance untouched
            return empty_output(x, self.weight, self.bias, self.v)
        cdt = compute_dtype(x.dtype)
        hx = x.to(cdt)
        if self.training:
            var_b = hx.var((0, 2, 3), correction=0)  # (C,), differentiable as in BatchNorm
            with torch.no_grad():
                new = self.running_var.to(cdt).lerp(var_b.detach(), self.momentum)
                self.running_var.copy_(new)
        else:
            var_b = self.running_var.to(cdt)
        std_b = torch.sqrt(channel_view(var_b, 4) + self.eps)  # (1, C, 1, 1)
        std_in = torch.sqrt(hx.var((2, 3), correction=0, keepdim=True) + self.eps)  # (N, C, 1, 1)
        weight, bias, v = self._params(cdt)
        y = hx / torch.maximum(std_b, v * hx + std_in) * weight + bias
        return y.to(x.dtype)


def evonorm_groups(num_channels: int, groups: int) -> int:
    """The groups EvoNorm-S0 uses: the largest divisor of ``num_channels`` that is at most ``groups``."""
    return next(g for g in range(min(groups, num_channels), 0, -1) if num_channels % g == 0)


class EvoNormS0(_EvoNorm):
    """EvoNorm-S0 over ``(N, C, H, W)``: batch-independent (GroupNorm-like statistics, a Swish-like numerator)."""

    def __init__(
        self,
        num_features: int,
        groups: int = 32,
        eps: float = 1e-5,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(num_features, eps, device, dtype)
        self.groups = check_num_features("groups", groups)
        self.num_groups = evonorm_groups(num_features, groups)
        self.reset_parameters()

    def extra_repr(self) -> str:
        return f"{self.num_features}, groups={self.groups} (num_groups={self.num_groups}), eps={self.eps}"

    def forward(self, x: Tensor) -> Tensor:
        check_input(self, x, (4,), "(N, C, H, W)")
        n, c, h, w = x.shape
        if x.numel() == 0:  # zero-size rule: an empty output
            return empty_output(x, self.weight, self.bias, self.v)
        cdt = compute_dtype(x.dtype)
        hx = x.to(cdt)
        grouped = hx.reshape(n, self.num_groups, c // self.num_groups, h, w)  # (N, G, C/G, H, W)
        std_g = torch.sqrt(grouped.var((2, 3, 4), correction=0, keepdim=True) + self.eps)  # (N, G, 1, 1, 1)
        std_g = std_g.expand_as(grouped).reshape(n, c, h, w)  # (N, C, H, W)
        weight, bias, v = self._params(cdt)
        y = hx * torch.sigmoid(v * hx) / std_g * weight + bias
        return y.to(x.dtype)
