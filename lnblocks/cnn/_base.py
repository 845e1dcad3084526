"""Shared base of the running-statistics norms (BatchNorm, SyncBatchNorm, InstanceNorm, BatchRenorm).

Same constructor, parameters, buffers, ``state_dict`` keys and checkpoint versioning as ``torch.nn``'s ``_NormBase``,
so a state_dict moves between these modules and ``torch.nn.BatchNorm*d`` / ``InstanceNorm*d`` in both directions;
plus argument and input checks that raise ``ValueError``/``TypeError`` naming the argument.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from lnblocks.cnn.functional import check_float_tensor, running_average_factor


def check_num_features(name: str, value: object) -> int:
    """A positive int, else ``TypeError``/``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


def check_eps(eps: object) -> float:
    """A finite float ``>= 0``."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (0 <= eps < float("inf")):
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    return float(eps)


def check_momentum(momentum: object, allow_none: bool = True) -> float | None:
    """A number in ``[0, 1]`` (the weight of the new batch in a running average), or None where allowed."""
    expected = "a float in [0, 1]" + (" or None (cumulative average)" if allow_none else "")
    if momentum is None and allow_none:
        return None
    if isinstance(momentum, bool) or not isinstance(momentum, (int, float)):
        raise TypeError(f"momentum must be {expected}, got {momentum!r}")
    if not 0.0 <= momentum <= 1.0:
        raise ValueError(f"momentum must be {expected}, got {momentum}")
    return float(momentum)


def check_input(
    module: nn.Module,
    x: object,
    ranks: tuple[int, ...],
    layout: str,
    channels_arg: str = "num_features",
    channel_dim: int = 1,
) -> None:
    """``x`` a float tensor with one of ``ranks`` dims and as many channels at ``channel_dim`` (negative counts from
    the end, for inputs that may come without a batch dim) as the module's ``channels_arg`` attribute says;
    ``ValueError``/``TypeError`` naming ``x``, the module and that argument otherwise."""
    check_float_tensor("x", x)
    name = type(module).__name__
    if x.dim() not in ranks:
        expected = " or ".join(f"{r}-D" for r in ranks)
        raise ValueError(f"x: {name} expects a {expected} input {layout}, got a {x.dim()}-D tensor")
    dim = channel_dim % x.dim()
    channels = getattr(module, channels_arg)
    if x.shape[dim] != channels:
        raise ValueError(
            f"x: {name} has {channels_arg}={channels} but the input has {x.shape[dim]} channels "
            f"(dim {dim} of shape {tuple(x.shape)})"
        )


def empty_output(x: Tensor, *params: Tensor | None) -> Tensor:
    """The family's output for a zero-size ``x`` (N = 0 or a zero-size spatial dim): ``x``'s shape and dtype, joined
    to ``x`` and ``params`` so that a backward gives each a zero gradient (torch's ``batch_norm`` does the same), and
    no statistics computed or updated."""
    y = x.clone()
    for p in params:
        if p is not None:
            y = y + p.sum().to(y.dtype) * 0  # an empty result: only the graph edge matters
    return y


def check_flags(**flags: object) -> None:
    """Each flag a bool, else ``TypeError`` naming it."""
    for name, flag in flags.items():
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {flag!r}")


def register_affine(module: nn.Module, num_channels: int, affine: bool, bias: bool, factory: dict[str, Any]) -> None:
    """Per-channel ``weight`` (and ``bias`` unless ``bias=False``) Parameters, registered as None when absent."""
    module.register_parameter("weight", nn.Parameter(torch.empty(num_channels, **factory)) if affine else None)
    module.register_parameter("bias", nn.Parameter(torch.empty(num_channels, **factory)) if affine and bias else None)


def reset_affine(module: nn.Module) -> None:
    """Weight 1, bias 0 (where present)."""
    if module.weight is not None:
        nn.init.ones_(module.weight)
    if module.bias is not None:
        nn.init.zeros_(module.bias)


class NormBase(nn.Module):
    """Parameters ``weight``/``bias`` (if ``affine``) and buffers ``running_mean``/``running_var``/
    ``num_batches_tracked`` (if ``track_running_stats``), registered as ``None`` otherwise, exactly as torch does.

    Subclasses set ``_ranks`` (accepted input ranks) and ``_layout`` (the shape, for error messages).
    """

    _version = 2  # torch.nn's: version 2 added num_batches_tracked
    _ranks: tuple[int, ...] = ()
    _layout: str = ""
    _feature_dim_from_end: int | None = None  # set for inputs that may come without a batch dim (InstanceNorm)

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
        super().__init__()
        self.num_features = check_num_features("num_features", num_features)
        self.eps = check_eps(eps)
        self.momentum = check_momentum(momentum)
        check_flags(affine=affine, track_running_stats=track_running_stats, bias=bias)
        self.affine = affine
        self.track_running_stats = track_running_stats
        factory = {"device": device, "dtype": dtype}
        register_affine(self, num_features, affine, bias, factory)
        if track_running_stats:
            self.register_buffer("running_mean", torch.zeros(num_features, **factory))
            self.register_buffer("running_var", torch.ones(num_features, **factory))
            self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long, device=device))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)
        self.reset_parameters()

    def reset_running_stats(self) -> None:
        """Running mean 0, running variance 1, no batches seen."""
        if self.track_running_stats:
            self.running_mean.zero_()
            self.running_var.fill_(1)
            self.num_batches_tracked.zero_()

    def reset_parameters(self) -> None:
        """Running statistics reset, weight 1, bias 0."""
        self.reset_running_stats()
        reset_affine(self)

    def extra_repr(self) -> str:
        return (
            f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
            f"bias={self.bias is not None}, track_running_stats={self.track_running_stats}"
        )

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        # Checkpoints from before num_batches_tracked existed (version < 2) load with a count of 0, as in torch.
        version = local_metadata.get("version")
        key = prefix + "num_batches_tracked"
        if (version is None or version < 2) and self.track_running_stats and key not in state_dict:
            state_dict[key] = torch.tensor(0, dtype=torch.long)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    # ---- checks ----------------------------------------------------------------------------------------------
    def _feature_dim(self, x: Tensor) -> int:
        return 1 if self._feature_dim_from_end is None else x.dim() - self._feature_dim_from_end

    def _check_input(self, x: Tensor) -> None:
        check_float_tensor("x", x)
        name = type(self).__name__
        if x.dim() not in self._ranks:
            ranks = " or ".join(f"{r}-D" for r in self._ranks)
            raise ValueError(f"x: {name} expects a {ranks} input {self._layout}, got a {x.dim()}-D tensor")
        c = x.shape[self._feature_dim(x)]
        if c != self.num_features:
            raise ValueError(
                f"x: {name} has num_features={self.num_features} but the input has {c} channels "
                f"(dim {self._feature_dim(x)} of shape {tuple(x.shape)})"
            )

    def _check_batch_statistics(self, x: Tensor, values_per_channel: int, over: str) -> None:
        if values_per_channel == 1:
            raise ValueError(
                f"x: {type(self).__name__} needs more than 1 value per channel {over} to compute statistics "
                f"in training mode, got shape {tuple(x.shape)}; use a larger input or eval mode"
            )

    # ---- running statistics ----------------------------------------------------------------------------------
    def _advance(self) -> float:
        """Count this training batch (if tracking) and return the running-average factor for it."""
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            return running_average_factor(self.momentum, self.num_batches_tracked)
        return 0.0 if self.momentum is None else self.momentum
