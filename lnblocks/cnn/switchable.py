"""Switchable Normalization (Luo, Ren, Peng, Zhang & Li 2018, arXiv 1806.10779): a learned mix of IN, LN and BN.

For ``x`` of shape ``(N, C, H, W)`` every statistic comes from the instance moments ``mu_in``, ``var_in`` (per
``(n, c)`` over ``(H, W)``, biased, as in the paper's Eq. 1):

    mu_ln = mean_c mu_in,   var_ln = mean_c (var_in + mu_in^2) - mu_ln^2      per sample
    mu_bn = mean_n mu_in,   var_bn = mean_n (var_in + mu_in^2) - mu_bn^2      per channel
    mu  = sum_k softmax(mean_weight)_k mu_k,   var = sum_k softmax(var_weight)_k var_k,   k in (in, ln, bn)
    y   = weight * (x - mu) / sqrt(var + eps) + bias

``mean_weight`` and ``var_weight`` are the paper's separate importance logits, initialised equal (weights 1/3 each);
read the learned mix with ``switch_weights()``. Choices where the paper and its released code leave room:

- Variances are biased everywhere (the paper's equations; the released code's ``Tensor.var`` is unbiased).
  ``var_ln`` and ``var_bn`` are computed in the equivalent, cancellation-free form
  ``mean(var_in + (mu_in - mu)^2)`` (exact because every instance has the same ``H * W`` count).
- The BN part keeps BatchNorm's running statistics, with BatchNorm's rule and buffers: training moves
  ``running_mean``/``running_var`` towards ``mu_bn`` and the *unbiased* batch variance with ``momentum`` (torch's
  convention, the weight of the new batch; ``momentum=None`` = cumulative average: reset and run over a few
  training batches after training, it is close to the paper's "batch average" of Sec. 3.1, which averages the
  per-batch second moments instead); eval mode uses them in place of
  ``mu_bn``/``var_bn`` while IN and LN stay per-sample. ``track_running_stats=False`` uses batch statistics in eval.
  So with all weight on BN it *is* ``torch.nn.BatchNorm2d`` (state_dict included), on IN ``InstanceNorm2d``
  with an affine, on LN ``GroupNorm(1, C)`` -- all tested.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from lnblocks.cnn._base import NormBase, empty_output
from lnblocks.cnn.functional import channel_view, compute_dtype, moments, normalize, update_running_stats

SOURCES = ("in", "ln", "bn")  # the order of the entries of mean_weight and var_weight


class SwitchableNorm2d(NormBase):
    """Switchable Normalization over ``(N, C, H, W)``. Ctor as ``torch.nn.BatchNorm2d``'s; adds the Parameters
    ``mean_weight`` and ``var_weight`` (3 logits each, for IN, LN, BN) to BatchNorm's state_dict."""

    _ranks = (4,)
    _layout = "(N, C, H, W)"

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        device: Any = None,
        dtype: torch.dtype | None = None,
        *,
        bias: bool = True,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype, bias=bias)
        self.mean_weight = nn.Parameter(torch.ones(3, device=device, dtype=dtype))
        self.var_weight = nn.Parameter(torch.ones(3, device=device, dtype=dtype))

    def reset_parameters(self) -> None:
        """Running statistics reset, weight 1, bias 0, equal IN/LN/BN importances."""
        super().reset_parameters()
        for name in ("mean_weight", "var_weight"):
            if name in self._parameters:  # not yet registered while NormBase.__init__ runs
                nn.init.ones_(self._parameters[name])

    def switch_weights(self) -> dict[str, dict[str, float]]:
        """The learned mix: ``{"mean": {"in": w, "ln": w, "bn": w}, "var": {...}}`` (softmax of the logits)."""
        out = {}
        for kind, logits in (("mean", self.mean_weight), ("var", self.var_weight)):
            w = torch.softmax(logits.detach().double(), 0).tolist()
            out[kind] = dict(zip(SOURCES, w, strict=True))
        return out

    def forward(self, x: Tensor) -> Tensor:
        self._check_input(x)
        n, _, h, w = x.shape
        use_batch_stats = self.training or self.running_mean is None
        if use_batch_stats:
            self._check_batch_statistics(x, n * h * w, "(over batch and spatial dims)")
        factor = self._advance()  # counted even when empty, as torch's BatchNorm counts it
        if x.numel() == 0:  # zero-size rule: an empty output, no statistics computed or updated
            return empty_output(x, self.weight, self.bias, self.mean_weight, self.var_weight)
        cdt = compute_dtype(x.dtype)
        mean_in, var_in = moments(x, (2, 3))  # (N, C, 1, 1) each, in cdt
        mean_ln = mean_in.mean(1, keepdim=True)  # (N, 1, 1, 1)
        var_ln = (var_in + (mean_in - mean_ln) ** 2).mean(1, keepdim=True)
        if use_batch_stats:
            mean_bn = mean_in.mean(0, keepdim=True)  # (1, C, 1, 1)
            var_bn = (var_in + (mean_in - mean_bn) ** 2).mean(0, keepdim=True)
            if self.training and self.track_running_stats:
                update_running_stats(self.running_mean, self.running_var, mean_bn, var_bn, n * h * w, factor)
        else:
            mean_bn = channel_view(self.running_mean.to(cdt), 4)
            var_bn = channel_view(self.running_var.to(cdt), 4)
        wm = torch.softmax(self.mean_weight.to(cdt), 0)
        wv = torch.softmax(self.var_weight.to(cdt), 0)
        mean = wm[0] * mean_in + wm[1] * mean_ln + wm[2] * mean_bn  # (N, C, 1, 1)
        var = wv[0] * var_in + wv[1] * var_ln + wv[2] * var_bn
        return normalize(x, (2, 3), self.weight, self.bias, self.eps, mean=mean, var=var)
