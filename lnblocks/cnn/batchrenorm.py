"""Batch Renormalization (Ioffe 2017): BatchNorm whose training output is corrected towards the running statistics.

Training computes ``x_hat = (x - mu_B) / sigma_B * r + d`` with ``sigma_B = sqrt(var_B + eps)``,
``sigma = sqrt(running_var + eps)`` and the per-channel corrections, treated as constants by the gradient,

    r = clip(sigma_B / sigma, 1 / r_max, r_max),    d = clip((mu_B - running_mean) / sigma, -d_max, d_max).

Unclipped, ``x_hat = (x - running_mean) / sigma``: the same function as in eval mode, so a small, noisy batch no
longer changes what the network computes between training and inference. ``r_max=1, d_max=0`` is plain BatchNorm.
Ioffe's warm-up is built in: ``r_max = 1, d_max = 0`` for ``warmup_steps`` training batches, then both limits grow
linearly to their targets over ``r_ramp_steps`` / ``d_ramp_steps`` batches (the step is ``num_batches_tracked``).

State and eval mode are BatchNorm's (same buffers and state_dict keys as ``torch.nn.BatchNorm*d``, running
variance unbiased, ``momentum=None`` = cumulative average); the paper averages the batch *std* instead, which
differs slightly (Jensen's inequality). ``fold_batchnorm`` folds it like BatchNorm.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lnblocks.cnn._base import NormBase
from lnblocks.cnn.functional import batch_moments, compute_dtype, update_running_stats


def _check_steps(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return value


class BatchRenormBase(NormBase):
    """Shared forward of BatchRenorm1d/2d. Running statistics are required, so there is no
    ``track_running_stats`` argument; the rest of the ctor is BatchNorm's plus the limits and their schedule."""

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        r_max: float = 3.0,
        d_max: float = 5.0,
        warmup_steps: int = 0,
        r_ramp_steps: int = 0,
        d_ramp_steps: int = 0,
        device: Any = None,
        dtype: torch.dtype | None = None,
        *,
        bias: bool = True,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, True, device, dtype, bias=bias)
        if isinstance(r_max, bool) or not isinstance(r_max, (int, float)) or not 1.0 <= r_max < math.inf:
            raise ValueError(f"r_max must be a finite number >= 1, got {r_max!r}")
        if isinstance(d_max, bool) or not isinstance(d_max, (int, float)) or not 0.0 <= d_max < math.inf:
            raise ValueError(f"d_max must be a finite number >= 0, got {d_max!r}")
        self.r_max, self.d_max = float(r_max), float(d_max)
        self.warmup_steps = _check_steps("warmup_steps", warmup_steps)
        self.r_ramp_steps = _check_steps("r_ramp_steps", r_ramp_steps)
        self.d_ramp_steps = _check_steps("d_ramp_steps", d_ramp_steps)

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, r_max={self.r_max}, d_max={self.d_max}, warmup_steps={self.warmup_steps}, "
            f"r_ramp_steps={self.r_ramp_steps}, d_ramp_steps={self.d_ramp_steps}"
        )

    def limits(self, step: int | None = None) -> tuple[float, float]:
        """``(r_max, d_max)`` in force at training ``step`` (default: the next batch, ``num_batches_tracked``)."""
        step = int(self.num_batches_tracked) if step is None else step

        def progress(ramp: int) -> float:
            if step < self.warmup_steps:
                return 0.0
            return 1.0 if ramp == 0 else min(1.0, (step - self.warmup_steps) / ramp)

        return 1.0 + (self.r_max - 1.0) * progress(self.r_ramp_steps), self.d_max * progress(self.d_ramp_steps)

    def forward(self, x: Tensor) -> Tensor:
        self._check_input(x)
        if not self.training:  # eval: BatchNorm with the running statistics
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)
        r_max, d_max = self.limits()
        factor = self._advance()  # counted even when empty, as torch's BatchNorm counts it
        if x.numel() == 0:  # zero-size rule: BatchNorm's empty output, no statistics update
            return F.batch_norm(x, None, None, self.weight, self.bias, True, 0.0, self.eps)
        count = x.numel() // x.shape[1]
        self._check_batch_statistics(x, count, "(over batch and spatial dims)")
        cdt = compute_dtype(x.dtype)
        with torch.no_grad():  # r and d are constants for the gradient (Ioffe 2017, Alg. 1)
            mean, var = batch_moments(x)  # (C,) each, biased, in cdt
            sigma = torch.sqrt(self.running_var.to(cdt) + self.eps)
            r = (torch.sqrt(var + self.eps) / sigma).clamp(1.0 / r_max, r_max)
            d = ((mean - self.running_mean.to(cdt)) / sigma).clamp(-d_max, d_max)
        # weight * (x_hat * r + d) + bias == x_hat * (weight * r) + (weight * d + bias): BatchNorm with batch
        # statistics and an effective affine, so the native kernel does the work (x_hat's gradient included).
        w = r if self.weight is None else self.weight.to(cdt) * r
        b = d if self.weight is None else self.weight.to(cdt) * d
        if self.bias is not None:
            b = b + self.bias.to(cdt)
        pdt = x.dtype if self.weight is None else self.weight.dtype
        y = F.batch_norm(x, None, None, w.to(pdt), b.to(pdt), True, 0.0, self.eps)
        update_running_stats(self.running_mean, self.running_var, mean, var, count, factor)
        return y


class BatchRenorm1d(BatchRenormBase):
    """Batch Renormalization over ``(N, C)`` or ``(N, C, L)``."""

    _ranks = (2, 3)
    _layout = "(N, C) or (N, C, L)"


class BatchRenorm2d(BatchRenormBase):
    """Batch Renormalization over ``(N, C, H, W)`` (Ioffe 2017)."""

    _ranks = (4,)
    _layout = "(N, C, H, W)"
