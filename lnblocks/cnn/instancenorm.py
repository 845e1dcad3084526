"""InstanceNorm1d/2d/3d (Ulyanov et al. 2016) with ``torch.nn.InstanceNorm*d`` semantics and state_dict keys.

Statistics per sample and channel, over the spatial dims: ``normalize(x, dims=(2, ...))``. Defaults as in torch:
``affine=False``, ``track_running_stats=False``. With ``track_running_stats=True`` training moves the running
statistics towards the batch average of the per-instance statistics and eval mode normalises with them, as torch
does (and, as in torch, ``num_batches_tracked`` is kept for state_dict compatibility but not advanced). Inputs may
omit the batch dim (``(C, L)`` for 1d, ``(C, H, W)`` for 2d). Two deliberate differences from torch, both where
torch gives a silent wrong answer: a channel count that differs from ``num_features`` is a ``ValueError`` even
without affine/running stats (torch only warns), and ``momentum=None`` with running statistics is a ``ValueError``
(torch silently freezes the running statistics instead of averaging).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lnblocks.cnn._base import NormBase, empty_output


class InstanceNormBase(NormBase):
    """Shared forward of InstanceNorm1d/2d/3d; ``_spatial`` is the number of spatial dims."""

    _spatial: int = 0

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = False,
        track_running_stats: bool = False,
        device: Any = None,
        dtype: torch.dtype | None = None,
        *,
        bias: bool = True,
    ) -> None:
        if momentum is None and track_running_stats:
            raise ValueError(
                "momentum=None (cumulative average) is not supported by InstanceNorm with track_running_stats=True "
                "(torch.nn.InstanceNorm would silently never update the running statistics); pass a float"
            )
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype, bias=bias)
        self._feature_dim_from_end = self._spatial + 1

    def forward(self, x: Tensor) -> Tensor:
        self._check_input(x)
        unbatched = x.dim() == self._spatial + 1
        if unbatched:
            x = x.unsqueeze(0)  # (1, C, *)
        if x.numel() == 0:  # zero-size rule: an empty output, no running statistics (torch raises an IndexError at N=0)
            y = empty_output(x, self.weight, self.bias)
            return y.squeeze(0) if unbatched else y
        use_input_stats = self.training or not self.track_running_stats
        if use_input_stats:
            self._check_batch_statistics(x, math.prod(x.shape[2:]), "(over spatial dims)")
        y = F.instance_norm(
            x,
            self.running_mean,
            self.running_var,
            self.weight,
            self.bias,
            use_input_stats,
            self.momentum if self.momentum is not None else 0.0,
            self.eps,
        )
        return y.squeeze(0) if unbatched else y


class InstanceNorm1d(InstanceNormBase):
    """InstanceNorm over ``(N, C, L)`` or unbatched ``(C, L)``: statistics per sample and channel over L."""

    _spatial = 1
    _ranks = (2, 3)
    _layout = "(N, C, L) or (C, L)"


class InstanceNorm2d(InstanceNormBase):
    """InstanceNorm over ``(N, C, H, W)`` or unbatched ``(C, H, W)``: statistics per sample and channel."""

    _spatial = 2
    _ranks = (3, 4)
    _layout = "(N, C, H, W) or (C, H, W)"


class InstanceNorm3d(InstanceNormBase):
    """InstanceNorm over ``(N, C, D, H, W)`` or unbatched ``(C, D, H, W)``: statistics per sample and channel."""

    _spatial = 3
    _ranks = (4, 5)
    _layout = "(N, C, D, H, W) or (C, D, H, W)"
