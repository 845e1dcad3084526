"""Convolutions with standardized weights: normalization moved from the activations to the weights.

``WSConv2d`` -- Weight Standardization (Qiao, Liu, Yang & Yuille 2019, arXiv 1903.10520, Eq. 5-6): each output
filter ``W_i`` (over ``in_channels/groups x kh x kw``) is standardized before the convolution,

    W_hat_i = (W_i - mean(W_i)) / sqrt(var(W_i) + eps),        biased variance, eps = 1e-5,

as in the paper's equations (the authors' released code divides by the unbiased std plus eps instead). Usually
paired with GroupNorm, where it recovers BatchNorm's accuracy at small batches.

``ScaledWSConv2d`` -- Scaled Weight Standardization of the Normalizer-Free ResNets (Brock, De & Smith 2021, arXiv
2101.08692) and NFNets (Brock, De, Smith & Simonyan 2021, arXiv 2102.06171): with ``fan_in`` the filter size and a
learnable per-filter ``gain`` (initially 1),

    W_hat_i = gamma * gain_i * (W_i - mean(W_i)) / sqrt(max(fan_in * var(W_i), eps)),      eps = 1e-4,

the authors' NFNet code's form (eps floors ``fan_in * var`` rather than being added). ``gamma`` is the fixed gain of
the nonlinearity that follows (1 by default; for ReLU the paper's ``sqrt(2 / (1 - 1/pi))``, ``RELU_GAMMA``), which
keeps a unit-variance input at unit variance through conv + activation, so no activation norm is needed.

Both are ``torch.nn.Conv2d`` subclasses: same ctor (plus keyword ``eps``, ``gamma``), ``weight``/``bias`` state_dict
keys (plus ``gain``), ``padding_mode`` and groups; the raw ``weight`` is the Parameter, ``standardized_weight()``
what the convolution uses. No statistics of the activations, so no train/eval difference.

``eps = 0`` is allowed: a constant filter (zero variance) then standardizes to 0 (the limit of ``0 / sqrt(eps)``;
the output is the bias), not NaN. Input sizes follow ``torch.nn.Conv2d``: an empty batch (N = 0) is accepted, a
zero-size spatial dim is refused (``ValueError`` here, where torch raises its internal error).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from lnblocks.cnn._base import check_eps, check_input
from lnblocks.cnn.functional import compute_dtype, inv_std, rsqrt_or_zero

RELU_GAMMA = math.sqrt(2.0 / (1.0 - 1.0 / math.pi))  # 1.7139: std of ReLU(z), z ~ N(0, 1), inverted (2101.08692)


class _StandardizedConv2d(nn.Conv2d):
    """Conv2d whose forward convolves with ``standardized_weight()`` (defined by subclasses)."""

    def standardized_weight(self) -> Tensor:
        raise NotImplementedError

    def _weight_moments(self) -> tuple[Tensor, Tensor]:
        """Per-filter mean and biased variance of ``weight``, ``(out, 1, 1, 1)`` each, in fp32/fp64."""
        var, mean = torch.var_mean(
            self.weight.to(compute_dtype(self.weight.dtype)), (1, 2, 3), correction=0, keepdim=True
        )
        return mean, var

    def forward(self, x: Tensor) -> Tensor:
        check_input(self, x, (3, 4), "(N, C, H, W) or (C, H, W)", "in_channels", channel_dim=-3)
        if 0 in x.shape[-2:]:
            raise ValueError(
                f"x: {type(self).__name__} needs non-empty spatial dims (torch.nn.Conv2d supports only an empty "
                f"batch), got shape {tuple(x.shape)}"
            )
        return self._conv_forward(x, self.standardized_weight(), self.bias)


class WSConv2d(_StandardizedConv2d):
    """Conv2d with Weight Standardization (Qiao et al. 2019). Ctor as ``torch.nn.Conv2d`` plus ``eps``."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] = 1,
        padding: str | int | tuple[int, int] = 0,
        dilation: int | tuple[int, int] = 1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        device: Any = None,
        dtype: torch.dtype | None = None,
        *,
        eps: float = 1e-5,
    ) -> None:
        super().__init__(
            in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias, padding_mode, device, dtype
        )
        self.eps = check_eps(eps)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, eps={self.eps}"

    def standardized_weight(self) -> Tensor:
        """``(W - mean) / sqrt(var + eps)`` per output filter, in ``weight``'s dtype."""
        mean, var = self._weight_moments()
        return ((self.weight - mean) * inv_std(var, self.eps)).to(self.weight.dtype)


class ScaledWSConv2d(_StandardizedConv2d):
    """Conv2d with Scaled Weight Standardization and a learnable per-filter ``gain`` (NF-ResNets, NFNets).
    Ctor as ``torch.nn.Conv2d`` plus ``gamma`` (fixed activation gain) and ``eps``."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] = 1,
        padding: str | int | tuple[int, int] = 0,
        dilation: int | tuple[int, int] = 1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        device: Any = None,
        dtype: torch.dtype | None = None,
        *,
        gamma: float = 1.0,
        eps: float = 1e-4,
    ) -> None:
        super().__init__(
            in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias, padding_mode, device, dtype
        )
        if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not 0 < gamma < math.inf:
            raise ValueError(f"gamma must be a finite number > 0 (the activation's gain), got {gamma!r}")
        self.gamma = float(gamma)
        self.eps = check_eps(eps)
        self.gain = nn.Parameter(torch.ones(out_channels, device=device, dtype=dtype))

    def reset_parameters(self) -> None:
        """Conv2d's initialisation, and gain 1."""
        super().reset_parameters()
        if "gain" in self._parameters:  # not yet registered while Conv2d.__init__ runs
            nn.init.ones_(self.gain)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, gamma={self.gamma}, eps={self.eps}"

    def standardized_weight(self) -> Tensor:
        """``gamma * gain * (W - mean) / sqrt(max(fan_in * var, eps))`` per output filter, in ``weight``'s dtype."""
        mean, var = self._weight_moments()
        fan_in = self.weight[0].numel()
        floored = (var * fan_in).clamp_min(self.eps)
        inv = torch.rsqrt(floored) if self.eps > 0 else rsqrt_or_zero(floored)
        scale = inv * self.gain.to(var.dtype).view(-1, 1, 1, 1)
        return ((self.weight - mean) * (scale * self.gamma)).to(self.weight.dtype)
