"""GroupNorm (Wu & He 2018) with ``torch.nn.GroupNorm`` semantics and state_dict keys.

Statistics per sample over each group of ``num_channels // num_groups`` channels and all spatial positions:
``normalize(x, dims=(1, 2, 3), groups=num_groups)``. No batch statistics, so no train/eval difference and no
dependence on the batch size -- the property the digits study (``lnblocks.study.digits``) checks.
``num_groups=1`` is LayerNorm over (C, H, W); ``num_groups=num_channels`` is InstanceNorm with a per-channel affine.
The arithmetic is the native kernel (``F.group_norm``), equal to ``normalize`` within rounding (tested) and about
10x faster on CPU.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lnblocks.cnn._base import check_eps, check_flags, check_num_features, empty_output, register_affine, reset_affine
from lnblocks.cnn.functional import check_float_tensor


class GroupNorm(nn.Module):
    """GroupNorm over ``(N, C, *)``; ``num_groups`` must divide ``num_channels``. Same ctor as torch's."""

    def __init__(
        self,
        num_groups: int,
        num_channels: int,
        eps: float = 1e-5,
        affine: bool = True,
        device: Any = None,
        dtype: torch.dtype | None = None,
        *,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.num_groups = check_num_features("num_groups", num_groups)
        self.num_channels = check_num_features("num_channels", num_channels)
        if num_channels % num_groups:
            raise ValueError(f"num_groups ({num_groups}) must divide num_channels ({num_channels})")
        self.eps = check_eps(eps)
        check_flags(affine=affine, bias=bias)
        self.affine = affine
        register_affine(self, num_channels, affine, bias, {"device": device, "dtype": dtype})
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Weight 1, bias 0."""
        reset_affine(self)

    def extra_repr(self) -> str:
        return (
            f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}, "
            f"bias={self.bias is not None}"
        )

    def forward(self, x: Tensor) -> Tensor:
        check_float_tensor("x", x)
        if x.dim() < 2:
            raise ValueError(f"x: GroupNorm expects a (N, C, *) input with at least 2 dims, got shape {tuple(x.shape)}")
        if x.shape[1] != self.num_channels:
            raise ValueError(
                f"x: GroupNorm has num_channels={self.num_channels} but the input has {x.shape[1]} channels "
                f"(dim 1 of shape {tuple(x.shape)})"
            )
        if x.numel() == 0:  # zero-size rule (torch's group_norm gives NaN weight grads for an empty spatial dim)
            return empty_output(x, self.weight, self.bias)
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)
