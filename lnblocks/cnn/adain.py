"""Adaptive Instance Normalization (Huang & Belongie 2017, arXiv 1703.06868), the style-transfer layer:

    AdaIN(x, s) = sigma_s * (x - mu_x) / sqrt(var_x + eps) + mu_s

with ``mu_x``, ``var_x`` the content's per-``(n, c)`` mean and *biased* variance over its spatial dims (InstanceNorm
without affine). The style enters either as a feature map -- then ``mu_s`` and ``sigma_s = sqrt(var_s + eps)`` are
its per-``(n, c)`` statistics, computed the same way, so ``AdaIN(x, x) == x`` -- or as given ``(mu_s, sigma_s)``
tensors, used as they are. No learnable parameters, no train/eval difference; gradients flow to content and style.
``eps = 0`` is allowed: a constant content channel (zero variance) then becomes the style's mean (its normalised
value is 0, the ``eps -> 0`` limit), not NaN. An empty content (N = 0 or a zero-size spatial dim) gives an empty
output.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from lnblocks.cnn._base import check_eps, empty_output
from lnblocks.cnn.functional import check_float_tensor, compute_dtype, inv_std, moments

Style = Tensor | tuple[Tensor, Tensor]


def _style_statistics(style: object, n: int, c: int, ndim: int, eps: float, cdt: torch.dtype) -> tuple[Tensor, Tensor]:
    """``(mu_s, sigma_s)``, each ``(N or 1, C, 1, ...)`` in ``cdt``."""
    if isinstance(style, Tensor):
        check_float_tensor("style", style)
        if style.dim() < 3 or style.shape[1] != c or style.shape[0] not in (1, n):
            raise ValueError(
                f"style: expected a feature map (N, C, *) with C={c} channels, N={n} or 1 and at least one spatial "
                f"dim, got shape {tuple(style.shape)}"
            )
        if math.prod(style.shape[2:]) == 0:
            raise ValueError(
                f"style: a feature map needs at least one spatial position, got shape {tuple(style.shape)}"
            )
        shape = (style.shape[0], c) + (1,) * (ndim - 2)
        if style.shape[0] == 0:  # an empty batch of styles (for an empty content): no statistics to compute
            return style.new_zeros(shape, dtype=cdt), style.new_zeros(shape, dtype=cdt)
        mu, var = moments(style.to(cdt), tuple(range(2, style.dim())))  # (N or 1, C, 1, ...)
        return mu.reshape(shape), torch.sqrt(var + eps).reshape(shape)
    if not (isinstance(style, (tuple, list)) and len(style) == 2):
        raise TypeError(
            f"style must be a feature map tensor (N, C, *) or a (mean, std) pair of tensors, got {type(style).__name__}"
        )
    out = []
    for name, t in zip(("style mean", "style std"), style, strict=True):
        check_float_tensor(name, t)
        if tuple(t.shape) not in ((n, c), (c,), (1, c)):
            raise ValueError(f"{name}: expected shape ({n}, {c}), (1, {c}) or ({c},), got {tuple(t.shape)}")
        out.append(t.to(cdt).reshape((-1, c) + (1,) * (ndim - 2)))
    return out[0], out[1]


def adaptive_instance_norm(content: Tensor, style: Style, eps: float = 1e-5) -> Tensor:
    """AdaIN of ``content`` ``(N, C, *)`` (at least one spatial dim, more than one position) with the statistics of
    ``style``: a feature map ``(N or 1, C, *')`` (its spatial size may differ) or a ``(mean, std)`` pair, each of
    shape ``(N, C)``, ``(1, C)`` or ``(C,)``. Computed in ``promote(content.dtype, float32)``, returned in
    ``content.dtype``."""
    check_float_tensor("content", content)
    eps = check_eps(eps)
    if content.dim() < 3:
        raise ValueError(f"content: expected (N, C, *) with at least one spatial dim, got shape {tuple(content.shape)}")
    n, c = content.shape[:2]
    if math.prod(content.shape[2:]) == 1:
        raise ValueError(
            f"content: AdaIN needs more than 1 spatial position per channel (with one, the content is erased), "
            f"got shape {tuple(content.shape)}"
        )
    cdt = compute_dtype(content.dtype)
    mu_s, sigma_s = _style_statistics(style, n, c, content.dim(), eps, cdt)
    if content.numel() == 0:  # the family's zero-size rule: an empty output, joined to content and style
        return empty_output(content, *(style if isinstance(style, (tuple, list)) else (style,)))
    h = content.to(cdt)
    mu_c, var_c = moments(h, tuple(range(2, content.dim())))  # (N, C, 1, ...)
    return (sigma_s * (h - mu_c) * inv_std(var_c, eps) + mu_s).to(content.dtype)


class AdaIN(nn.Module):
    """``adaptive_instance_norm`` as a module: ``AdaIN(eps)(content, style)``. No parameters or buffers."""

    def __init__(self, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = check_eps(eps)

    def extra_repr(self) -> str:
        return f"eps={self.eps}"

    def forward(self, content: Tensor, style: Style) -> Tensor:
        return adaptive_instance_norm(content, style, self.eps)
