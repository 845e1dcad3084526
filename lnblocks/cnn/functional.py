"""The unified view of CNN normalization: one ``normalize(x, dims)``, four classic norms as choices of ``dims``.

For ``x`` of shape ``(N, C, H, W)`` (Wu & He 2018, Fig. 2)::

    BatchNorm      normalize(x, dims=(0, 2, 3))              statistics per channel, over the batch
    LayerNorm      normalize(x, dims=(1, 2, 3))              per sample, over all channels and pixels
    InstanceNorm   normalize(x, dims=(2, 3))                 per sample and channel
    GroupNorm      normalize(x, dims=(1, 2, 3), groups=G)    per sample, over C/G channels of a group and pixels
    LayerNorm2d    normalize(x, dims=(1,))                   per pixel, over channels (ConvNeXt's channels-first LN)

The rest of the family is not a choice of ``dims`` of this function; what each normalizes (modules in
``lnblocks.cnn`` unless named otherwise, each tested against its paper's formula):

    SwitchableNorm2d  softmax-weighted mix of the IN, LN and BN means and of their variances (learned weights)
    FRN2d          x / sqrt(mean over (H, W) of x^2 + eps): per sample and channel, no mean subtracted
    EvoNormS0      x * sigmoid(v x) / std over GroupNorm's dims: per sample and group
    EvoNormB0      x / max(std over (N, H, W), v x + std over (H, W)): batch and instance statistics at once
    AdaIN          InstanceNorm of the content, then the style's per-(n, c) std and mean
    WSConv2d, ScaledWSConv2d   the conv *weights*, per output filter over (C_in/groups, kh, kw); not activations
    weight norm    ``torch.nn.utils.parametrizations.weight_norm``: w = g * v / |v| per output unit, the weights'
                   direction and length decoupled (Salimans & Kingma 2016, arXiv 1602.07868); not activations
    LRN            ``torch.nn.LocalResponseNorm(size)``: a_c / (k + alpha/size * sum of a^2 over the channels
                   c - size//2 ... c + (size-1)//2 that exist)^beta, per sample and pixel (Krizhevsky et al. 2012).
                   A sliding window with no mean and no variance, so no set of reduction dims expresses it and
                   ``normalize`` does not take it: use torch's module.

Statistics are biased (divide by the count, as every ``torch.nn`` norm does when normalising) and computed in
``promote(x.dtype, float32)``, so half inputs get fp32 statistics and fp64 stays fp64; the output has ``x``'s dtype.
``normalize`` is the reference the classic modules are tested against (outputs and grads). The modules themselves run
torch's native kernels (``F.batch_norm``, ``F.group_norm``, ``F.instance_norm``, ``F.layer_norm``), since composing
``normalize`` from ops costs 1.5-10x more time on CPU (``benchmarks/norms/bench_cnn_norms.py``). The running-statistics
update of BatchNorm (unbiased variance, ``momentum=None`` = cumulative average) lives here too, so the modules that
compute their own statistics (SyncBatchNorm, BatchRenorm) share one copy of that rule.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Where statistics are accumulated: fp32 for half and fp32 inputs, fp64 for fp64."""
    return torch.promote_types(dtype, torch.float32)


def check_float_tensor(name: str, t: object) -> None:
    """``TypeError`` unless ``t`` is a floating-point tensor."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must be a floating-point tensor (float16, bfloat16, float32, float64), got {t.dtype}")


def rsqrt_or_zero(total: Tensor) -> Tensor:
    """``1 / sqrt(total)``, and 0 where ``total`` is 0: the ``eps = 0`` rule of the family. There ``total`` is a
    variance (or FRN's mean square) of exactly 0, i.e. a constant group (an all-zero map for FRN), whose centred
    numerator is exactly 0; the result 0 is the ``eps -> 0`` limit of ``(x - mean) / sqrt(var + eps)`` instead of
    ``0 * inf = NaN``. Finite gradients (the masked entries see ``rsqrt(1)``). Call it only when ``eps`` is 0."""
    ok = total > 0
    return torch.where(ok, torch.rsqrt(torch.where(ok, total, torch.ones_like(total))), torch.zeros_like(total))


def inv_std(var: Tensor, eps: float) -> Tensor:
    """``rsqrt(var + eps)``; with ``eps == 0``, ``rsqrt_or_zero(var)`` (a zero-variance group normalises to 0)."""
    return torch.rsqrt(var + eps) if eps > 0 else rsqrt_or_zero(var + eps)


def channel_view(v: Tensor, ndim: int) -> Tensor:
    """A per-channel vector ``(C,)`` as ``(1, C, 1, ..., 1)`` broadcastable against an ``ndim``-D input."""
    return v.reshape((1, -1) + (1,) * (ndim - 2))


def reduce_dims(ndim: int) -> tuple[int, ...]:
    """BatchNorm's reduction dims: every dim but the channel dim 1, i.e. ``(0, 2, ..., ndim - 1)``."""
    return (0, *range(2, ndim))


def _canonical_dims(dims: Sequence[int], ndim: int) -> tuple[int, ...]:
    if isinstance(dims, int) or not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        raise TypeError(f"dims must be a sequence of ints, got {dims!r}")
    out = tuple(sorted(d % ndim if -ndim <= d < ndim else ndim for d in dims))
    if not out or out[-1] >= ndim or len(set(out)) != len(out):
        raise ValueError(f"dims must be distinct dims of a {ndim}-D input, got {tuple(dims)}")
    return out


def moments(x: Tensor, dims: Sequence[int]) -> tuple[Tensor, Tensor]:
    """``(mean, biased variance)`` of ``x`` over ``dims``, keepdim, in ``compute_dtype(x.dtype)``."""
    var, mean = torch.var_mean(x.to(compute_dtype(x.dtype)), dim=tuple(dims), correction=0, keepdim=True)
    return mean, var


def batch_moments(x: Tensor) -> tuple[Tensor, Tensor]:
    """BatchNorm's batch statistics of ``x`` ``(N, C, *)``: per-channel ``(mean, biased variance)``, each ``(C,)``, in
    ``compute_dtype(x.dtype)``; not differentiable (for running statistics and Batch Renormalization's r, d).

    Uses torch's native per-channel reduction (``torch.batch_norm_update_stats``, 3x faster than ``var_mean`` over
    ``(0, 2, 3)`` on CPU), falling back to ``var_mean`` where a backend lacks it.
    """
    h = x.detach().to(compute_dtype(x.dtype))
    try:
        return torch.batch_norm_update_stats(h, None, None, 0.0)
    except (AttributeError, NotImplementedError):  # no such op, or no kernel for this backend
        var, mean = torch.var_mean(h, dim=reduce_dims(x.dim()), correction=0)
        return mean, var


def normalize(
    x: Tensor,
    dims: Sequence[int],
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
    *,
    groups: int = 1,
    mean: Tensor | None = None,
    var: Tensor | None = None,
) -> Tensor:
    """``(x - mean) / sqrt(var + eps) * weight + bias`` with statistics over ``dims`` (see the module docstring).

    ``x``: ``(N, C, *)``. ``weight``/``bias``: per-channel ``(C,)`` or None. ``groups`` splits the channel dim
    into ``(groups, C // groups)`` first; a ``1`` in ``dims`` then means the channels inside a group (GroupNorm).
    ``mean``/``var``: precomputed statistics (e.g. running or all-reduced ones), broadcastable against ``x`` (or its
    grouped view); when given, ``dims`` is only checked. Differentiable by autograd, through the statistics too.
    ``eps`` may be 0: a group of zero variance (a constant one) then normalises to 0 (``inv_std``).
    """
    check_float_tensor("x", x)
    if x.dim() < 2:
        raise ValueError(f"x: expected a (N, C, *) input with at least 2 dims, got shape {tuple(x.shape)}")
    n, c = x.shape[:2]
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1 or c % groups:
        raise ValueError(f"groups must be a positive int dividing the {c} channels of x, got {groups!r}")
    for name, v in (("weight", weight), ("bias", bias)):
        if v is not None and tuple(v.shape) != (c,):
            raise ValueError(f"{name}: expected shape ({c},) (one value per channel of x), got {tuple(v.shape)}")
    if (mean is None) != (var is None):
        raise ValueError("mean and var must be given together (or neither)")
    dims = _canonical_dims(dims, x.dim())
    cdt = compute_dtype(x.dtype)
    h = x.to(cdt)
    if groups > 1:
        h = h.reshape(n, groups, c // groups, *x.shape[2:])  # (N, G, C/G, *)
        dims = tuple(d if d == 0 else d + 1 for d in dims)  # the group axis 1 is never reduced
    if mean is None:
        var, mean = torch.var_mean(h, dim=dims, correction=0, keepdim=True)
    h = (h - mean) * inv_std(var, eps)  # eps = 0: a zero-variance group gives 0, not NaN
    h = h.reshape(x.shape)  # (N, C, *)
    if weight is not None:
        h = h * channel_view(weight.to(cdt), x.dim())
    if bias is not None:
        h = h + channel_view(bias.to(cdt), x.dim())
    return h.to(x.dtype)


def running_average_factor(momentum: float | None, num_batches_tracked: Tensor | None) -> float:
    """The weight of the new batch in the running statistics: ``momentum``, or ``1 / batches`` if it is None.

    ``momentum=None`` is the cumulative (simple) average of every batch seen, as in ``torch.nn.BatchNorm``; call
    this after ``num_batches_tracked`` was advanced for the current batch.
    """
    if momentum is not None:
        return float(momentum)
    if num_batches_tracked is None:
        raise ValueError("momentum=None (cumulative average) needs num_batches_tracked (track_running_stats=True)")
    return 1.0 / float(num_batches_tracked)


@torch.no_grad()
def update_running_stats(
    running_mean: Tensor, running_var: Tensor, mean: Tensor, var: Tensor, count: int, factor: float
) -> None:
    """In place: ``running = (1 - factor) * running + factor * batch`` per channel, as ``torch.nn.BatchNorm`` does.

    ``mean``/``var`` are the batch's per-channel mean and *biased* variance (any shape with C elements); the running
    variance receives the unbiased one, ``var * count / (count - 1)`` (Ioffe & Szegedy 2015, Alg. 2). The update is
    computed in ``promote(buffer dtype, float32)`` and written back in the buffer's dtype.
    """
    if count < 2:
        raise ValueError(f"count: the unbiased running variance needs at least 2 values per channel, got {count}")
    cdt = compute_dtype(running_mean.dtype)
    unbiased = var.detach().reshape(-1).to(cdt) * (count / (count - 1))
    new_mean = running_mean.to(cdt) * (1.0 - factor) + mean.detach().reshape(-1).to(cdt) * factor
    new_var = running_var.to(cdt) * (1.0 - factor) + unbiased * factor
    running_mean.copy_(new_mean)
    running_var.copy_(new_var)
