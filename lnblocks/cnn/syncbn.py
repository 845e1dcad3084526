"""SyncBatchNorm: BatchNorm whose training statistics span a whole ``torch.distributed`` process group.

Exact for ranks with different batch sizes and different means: each rank sends ``(count, mean, M2)`` per channel
(``M2`` = count x biased variance), and the ranks merge them in fp64 with Chan et al.'s (1979) parallel formula,
``M2 = sum_r M2_r + n_r (mean_r - mean)^2`` -- not the average of per-rank variances, which drops the spread of the
means and weights small shards like large ones. The backward all-reduces the two sums it needs, ``sum(dy)`` and
``sum(dy * x_hat)``, so every rank's input gradient equals BatchNorm's on the concatenated batch. Works on CPU with
gloo (``torch.nn.SyncBatchNorm`` accepts only accelerator tensors). Eval mode, and a group of one process, run the
plain BatchNorm path.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from lnblocks.cnn.batchnorm import BatchNormBase
from lnblocks.cnn.functional import batch_moments, channel_view, compute_dtype, reduce_dims, update_running_stats


def _all_gather_stats(local: Tensor, group: Any) -> Tensor:
    """``(3, C)`` fp64 per rank -> ``(world, 3, C)``."""
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, local, group=group)
    return torch.stack(parts)


def merge_moments(stats: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Chan's parallel merge of per-shard ``(count, mean, M2)`` rows ``(S, 3, C)`` -> ``(count, mean, biased var)``.

    Exact for shards of any sizes (empty ones included) and any means; compute in fp64.
    """
    n, mu, m2 = stats.unbind(1)  # each (S, C)
    total = n.sum(0)  # (C,)
    mean = (n * mu).sum(0) / total.clamp_min(1)
    m2_all = (m2 + n * (mu - mean) ** 2).sum(0)
    return total, mean, m2_all / total.clamp_min(1)


class _SyncBatchNormFn(torch.autograd.Function):
    """Forward and backward of SyncBatchNorm in training; the collectives run inside both."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: Tensor,
        weight: Tensor | None,
        bias: Tensor | None,
        running_mean: Tensor | None,
        running_var: Tensor | None,
        eps: float,
        factor: float,
        group: Any,
    ) -> Tensor:
        c = x.shape[1]
        count = x.numel() // c
        cdt = compute_dtype(x.dtype)
        if count > 0:
            mean, var = batch_moments(x)  # (C,) each, local
        else:  # an empty shard contributes nothing
            mean = var = torch.zeros(c, dtype=cdt, device=x.device)
        local = torch.stack([torch.full_like(mean, count), mean, var * count]).double()  # (3, C)
        total, g_mean, g_var = merge_moments(_all_gather_stats(local, group))
        n_all = int(total[0].item())
        if n_all == 1:
            raise ValueError(
                "x: SyncBatchNorm needs more than 1 value per channel across the process group in training mode, "
                f"got 1 (local shape {tuple(x.shape)})"
            )
        if running_mean is not None and n_all > 1:
            update_running_stats(running_mean, running_var, g_mean, g_var, n_all, factor)
        # Normalising with given statistics is BatchNorm's eval-mode kernel (the gradient is ours, below).
        w, b = (None if t is None else t.to(cdt) for t in (weight, bias))  # one compute dtype for every operand
        y = F.batch_norm(x.to(cdt), g_mean.to(cdt), g_var.to(cdt), w, b, False, 0.0, eps).to(x.dtype)
        mean_v = channel_view(g_mean.to(cdt), x.dim())  # (1, C, 1, ...)
        invstd_v = torch.rsqrt(channel_view(g_var.to(cdt), x.dim()) + eps)
        ctx.save_for_backward(x, weight, mean_v, invstd_v)
        ctx.n_all, ctx.group = n_all, group
        return y

    @staticmethod
    def backward(ctx: Any, grad_y: Tensor) -> tuple[Tensor | None, ...]:
        x, weight, mean_v, invstd_v = ctx.saved_tensors
        dims = reduce_dims(x.dim())
        cdt = mean_v.dtype
        dy = grad_y.to(cdt)
        x_hat = (x.to(cdt) - mean_v) * invstd_v  # (N, C, *)
        sum_dy = dy.sum(dims)  # (C,), local
        sum_dy_xhat = (dy * x_hat).sum(dims)  # (C,), local
        grad_x = grad_w = grad_b = None
        # Parameter grads stay local, as in torch.nn.SyncBatchNorm: DDP all-reduces them like any parameter's.
        if weight is not None and ctx.needs_input_grad[1]:
            grad_w = sum_dy_xhat.to(weight.dtype)
        if ctx.needs_input_grad[2]:
            grad_b = sum_dy.to(weight.dtype if weight is not None else grad_y.dtype)
        if ctx.needs_input_grad[0]:
            sums = torch.stack([sum_dy, sum_dy_xhat]).double()  # (2, C)
            dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=ctx.group)
            mean_dy = channel_view(sums[0].to(cdt) / ctx.n_all, x.dim())
            mean_dy_xhat = channel_view(sums[1].to(cdt) / ctx.n_all, x.dim())
            scale = invstd_v if weight is None else invstd_v * channel_view(weight.to(cdt), x.dim())
            grad_x = ((dy - mean_dy - x_hat * mean_dy_xhat) * scale).to(x.dtype)
        return grad_x, grad_w, grad_b, None, None, None, None, None


class SyncBatchNorm(BatchNormBase):
    """BatchNorm over ``(N, C, *)`` synchronised across ``process_group`` (default: the world) in training.

    Same ctor as ``torch.nn.SyncBatchNorm``; same state_dict as ``BatchNorm*d``. Running statistics, outputs and
    input grads equal BatchNorm's on the concatenation of all ranks' batches; ``weight``/``bias`` grads are each
    rank's share (their sum over ranks is BatchNorm's), which DDP's gradient all-reduce combines.
    """

    _ranks = (2, 3, 4, 5)
    _layout = "(N, C, *)"

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        process_group: Any = None,
        device: Any = None,
        dtype: torch.dtype | None = None,
        *,
        bias: bool = True,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype, bias=bias)
        self.process_group = process_group

    def _sync_group(self) -> Any:
        """The group to synchronise over in this call, or None for the plain BatchNorm path."""
        if not (self._uses_batch_stats() and self.training and dist.is_available() and dist.is_initialized()):
            return None
        group = self.process_group if self.process_group is not None else dist.group.WORLD
        return group if dist.get_world_size(group) > 1 else None

    def forward(self, x: Tensor) -> Tensor:
        group = self._sync_group()
        if group is None:
            return super().forward(x)
        self._check_input(x)
        factor = self._advance()
        tracked = self.track_running_stats
        return _SyncBatchNormFn.apply(
            x,
            self.weight,
            self.bias,
            self.running_mean if tracked else None,
            self.running_var if tracked else None,
            self.eps,
            factor,
            group,
        )

    @classmethod
    def convert_sync_batchnorm(cls, module: nn.Module, process_group: Any = None) -> nn.Module:
        """See ``convert_sync_batchnorm``."""
        return convert_sync_batchnorm(module, process_group)


def _is_batchnorm(module: nn.Module) -> bool:
    # lnblocks BatchNorm*d and torch.nn.BatchNorm*d (not SyncBatchNorm: already synchronised).
    if isinstance(module, (SyncBatchNorm, nn.SyncBatchNorm)):
        return False
    return isinstance(module, (BatchNormBase, nn.modules.batchnorm._BatchNorm))


def convert_sync_batchnorm(module: nn.Module, process_group: Any = None) -> nn.Module:
    """Replace every BatchNorm*d in ``module`` (lnblocks' or ``torch.nn``'s) by a ``SyncBatchNorm`` sharing its
    parameters and buffers (same tensors, so optimizers and state_dicts keep working); returns the new root.

    BatchRenorm is left alone: it is a different estimator. Lazy BatchNorm modules must be materialised first.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    out = module
    if _is_batchnorm(module):
        if isinstance(module.weight, nn.parameter.UninitializedParameter):
            raise ValueError("module: materialise LazyBatchNorm modules (run one batch) before converting them")
        out = SyncBatchNorm(
            module.num_features,
            module.eps,
            module.momentum,
            module.affine,
            module.track_running_stats,
            process_group,
            bias=module.bias is not None,
        )
        with torch.no_grad():
            out.weight, out.bias = module.weight, module.bias
        out.running_mean = module.running_mean
        out.running_var = module.running_var
        out.num_batches_tracked = module.num_batches_tracked
        out.train(module.training)
        if hasattr(module, "qconfig"):
            out.qconfig = module.qconfig
    for name, child in module.named_children():
        out.add_module(name, convert_sync_batchnorm(child, process_group))
    return out
