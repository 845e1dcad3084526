"""Weight normalization and LRN are torch's own modules (lnblocks does not rewrite them); these tests pin the
formulas the documentation of ``lnblocks.cnn.functional`` and the README state for them, in fp64."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils.parametrizations import weight_norm


@pytest.mark.parametrize("layer", [nn.Linear(5, 3), nn.Conv2d(2, 4, 3)], ids=["linear", "conv"])
def test_weight_norm_is_g_times_v_over_its_norm_per_output_unit(layer) -> None:
    """Salimans & Kingma 2016 (arXiv 1602.07868): w = g v / |v|, one g per output unit (dim 0)."""
    m = weight_norm(layer.double())
    g = m.parametrizations.weight.original0  # (out, 1, ...)
    v = m.parametrizations.weight.original1
    with torch.no_grad():
        g.uniform_(0.5, 2.0)
    norms = (v**2).sum(dim=tuple(range(1, v.dim())), keepdim=True).sqrt()
    torch.testing.assert_close(m.weight, g * v / norms, atol=1e-14, rtol=1e-14)
    per_unit = m.weight.flatten(1).norm(dim=1)
    torch.testing.assert_close(per_unit, g.flatten().abs(), atol=1e-12, rtol=1e-12)  # length is g, whatever v is


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_local_response_norm_is_a_window_over_neighbouring_channels(size) -> None:
    """Krizhevsky et al. 2012: b_c = a_c / (k + alpha/size * sum of a^2 over channels c - size//2 ... c + (size-1)//2,
    clipped to the existing ones)^beta, per sample and pixel."""
    alpha, beta, k = 1e-2, 0.75, 2.0
    a = torch.randn(2, 6, 3, 4, dtype=torch.float64) * 3
    c = a.shape[1]
    expected = torch.empty_like(a)
    for ch in range(c):
        lo, hi = max(0, ch - size // 2), min(c - 1, ch + (size - 1) // 2)
        window = (a[:, lo : hi + 1] ** 2).sum(1)
        expected[:, ch] = a[:, ch] / (k + alpha / size * window) ** beta
    torch.testing.assert_close(nn.LocalResponseNorm(size, alpha, beta, k)(a), expected, atol=1e-14, rtol=1e-12)
